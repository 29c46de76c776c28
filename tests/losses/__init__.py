"""Tests of bench/losses/, one file a module (a package, so that file names may repeat in tests/miners/)."""
