"""Tests of the command line (``sat``) and of the rules every command follows."""
