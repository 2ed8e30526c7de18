"""The lossless core: how tokens are chosen (``sampling``), which drafts are accepted (``verify``) and the rules
every request's steps follow (``rules``). Whatever drafts and whatever policy, these decide the output."""
