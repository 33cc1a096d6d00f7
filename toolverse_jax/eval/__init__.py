"""Evaluation harnesses (BFCL multi-turn, GUST held-out; search/memory QA to come) behind one
registry (eval/registry.py) that `python -m experiments.evaluate` runs."""
