"""`optirack simulate`: its flags (flags.py), its run (main.py, the command's entry), what it writes (report.py,
plots.py) and the `make demo` record `--case` compares with (case_record.py)."""
