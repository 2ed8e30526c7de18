"""A draft head trained on the target's own features (EAGLE-3 style): the model, its training data, its training
and its file. The drafter that runs it is :mod:`quickdraft.drafters.eagle`."""
