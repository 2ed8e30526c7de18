"""What draft trees would buy over chains on this machine, from measured inputs (docs/design.md, "Draft trees").

Tokens per second of the best chain and the best tree, each over its own best shape, for a step of gamma drafts
(each accepted with probability a, independently), optional siblings at depths 1..m (the drafter's second choice
there, right with probability s where its first is wrong: each yields one more token when the path reaches it),
and optionally a second chain of b2 drafts under the depth-1 sibling. Cost: drafted tokens times the draft cost,
plus the target's measured t(rows) for every row of the tree.

    python tree_model.py [profile.json]
"""

import json
import sys


def best_rates(t: dict[int, float], a: float, s: float, draft_ms: float) -> dict[str, tuple[float, int, int, int]]:
    best: dict[str, tuple[float, int, int, int]] = {}
    for gamma in range(1, 15):
        for siblings in range(4):
            for second in range(5):
                rows = gamma + 1 + siblings + second
                if (second and not siblings) or rows > max(t):
                    continue
                tokens = (1 - a ** (gamma + 1)) / (1 - a)
                tokens += sum(a ** (i - 1) * (1 - a) * s for i in range(1, siblings + 1))
                tokens += (1 - a) * s * sum(a**j for j in range(1, second + 1))
                rate = 1000 * tokens / ((gamma + second) * draft_ms + t[rows])
                kind = "tree" if siblings else "chain"
                if rate > best.get(kind, (0.0, 0, 0, 0))[0]:
                    best[kind] = (round(rate, 2), gamma, siblings, second)
    return best


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "profile-after-no-amx-1.json"
    with open(path) as file:
        t = {int(k): v for k, v in json.load(file)["t_ms"].items()}
    cases = {  # (a, s, draft ms a token)
        "0.5B draft model (measured a 0.839, s 0.481; 14.3 ms a token)": (0.839, 0.481, 14.3),
        "the same acceptance, drafts free (an upper bound for copies)": (0.839, 0.481, 0.0),
        "trained head (measured a 0.41; s assumed 0.3; 2.6 ms a token)": (0.41, 0.3, 2.6),
    }
    print(f"cost curve: {path}")
    for name, (a, s, draft_ms) in cases.items():
        best = best_rates(t, a, s, draft_ms)
        chain, tree = best["chain"], best["tree"]
        print(
            f"{name}: chain {chain[0]} tok/s (gamma {chain[1]}); tree {tree[0]} tok/s (gamma {tree[1]}, "
            f"{tree[2]} siblings, second chain {tree[3]}); tree / chain {tree[0] / chain[0]:.3f}"
        )


if __name__ == "__main__":
    main()
