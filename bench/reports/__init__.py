"""Reports over results tables: leaderboards, regression checks and claim verdicts.

Every module here computes tables and verdicts as pure functions of the
tables `bench.results` reads; the commands in `bench.commands` are the only
place files are written.
"""
