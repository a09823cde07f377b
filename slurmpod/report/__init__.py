"""Post-job efficiency reports: per job and across the fleet (pure core; I/O in cli/report.py).

- `sacct`: `sacct --json --duplicates` -> records with every attempt;
- `model`: one job's report (figures, GPU time lost by cause, stability), `rules`: its notes;
- `placement`: SUs/racks/NVLink domains spanned against the fewest possible;
- `fleet`: aggregation; `text`, `html` (+ `plots`), `prom`: renderings.
"""
