"""Evals (§12): a digest is promoted when its evals pass.

`runs` runs an Eval's cases on one exact agent digest and stores the result;
`cases` runs one case through the runtime's public `Conversations` API;
`checks` holds the expectations a case is checked against, `judge` the
rubric's grading by a Model; `stand_ins` gives tool results in place of
tools. `gates` answers whether a digest passed what an alias, the lock or a
swap require.
"""
