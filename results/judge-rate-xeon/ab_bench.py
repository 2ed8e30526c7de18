"""`quickdraft bench` with one more policy, `goodput-before`: goodput as it was before the change under test
(a block runs to the planned γ at most, and its judge weighs a next draft against the plain rate 1 / t(1))."""

import sys
from dataclasses import fields, replace

from quickdraft.cli import main
from quickdraft.policies import goodput
from quickdraft.policies.base import POLICIES, PolicyKind, no_argument


class GoodputBefore(goodput.GoodputPolicy):
    def bid(self, state=goodput.UNKNOWN_STATE):
        bid = super().bid(state)
        if bid.offer is None or bid.offer.free:
            return bid
        judge = goodput.BlockJudge(bid.costs, self.continuation_rate(), 1.0 / bid.costs.target(1))
        return replace(bid, reach=None, keep_drafting=judge)


def _before(argument, context):
    made = goodput._goodput(argument, context)  # goodput as configured, its fields handed to the old rule
    return GoodputBefore(**{field.name: getattr(made, field.name) for field in fields(made) if field.init})


POLICIES.register("goodput-before")(
    PolicyKind(_before, no_argument("goodput-before"), needs_cost_model=True, learns_answers=True)
)
sys.exit(main(sys.argv[1:]))
