"""Where the nuclear-norm learner's default measurement count sits against its phase transition.

For rank-1 heads (the hardest case per degree of freedom) at d = 24: 12 random heads x 3
measurement seeds per ratio m / (r (2d - r)); a recovery counts as exact at relative error 1e-6.
The default of ``companion.lowrank.DEFAULT_OVERSAMPLING["nuclear"]`` must sit above the smallest
ratio at which every trial is exact, with a margin (issue 12). Run: ``python
benchmarks/nuclear_transition.py`` (about 3 minutes on one core).
"""

import numpy as np

from companion.attention import random_single_head
from companion.lowrank import DEFAULT_OVERSAMPLING, degrees_of_freedom, learn_low_rank
from companion.oracles import ValueQueryOracle


def main(d=24, r=1, ratios=(2.0, 3.0, 4.0, 5.0), n_heads=12, n_seeds=3):
    dof = degrees_of_freedom(d, r)
    print(f"d={d}, r={r}, r(2d - r)={dof}; default ratio {DEFAULT_OVERSAMPLING['nuclear']:g}")
    print("ratio      m  exact  worst rel. error")
    for q in ratios:
        m = int(np.ceil(q * dof))
        errs = []
        for h in range(n_heads):
            head = random_single_head(d, rank=r, seed=h)
            for s in range(n_seeds):
                rec = learn_low_rank(ValueQueryOracle(head), r, method="nuclear", n_measurements=m,
                                     verify=0, seed=s)
                errs.append(rec.relative_errors(head)["W"])
        exact = sum(e <= 1e-6 for e in errs)
        print(f"{q:5g} {m:6d}  {exact:2d}/{len(errs)}  {max(errs):.1e}")


if __name__ == "__main__":
    main()
