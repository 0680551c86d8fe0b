"""The closed-loop experiment (docs/closed_loop.md): a program outside the rlcycle package.

    run.py      the program, top to bottom: configs, the start, the arms' cycles, the report
    report.py   one arm's report: cycles, versions, online metrics, "did the policy improve"
    text.py     its plain-text tables
    compare.py  across the arms: v0 vs each last version (paired by session), "did it learn"

rlcycle never imports this package (tests/test_layers.py checks it).
"""
