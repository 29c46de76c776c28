"""Tests of bench/miners/, one file a module (a package, so that file names may repeat in tests/losses/)."""
