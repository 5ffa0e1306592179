"""Advisory feeds read into `gpufleet.assets.records.Advisory`: OSV (`osv`), the NVD CVE API 2.0 (`nvd`)
and CSAF 2.0 (`csaf`); `load` reads files, directories and OSV's per-ecosystem zip archives and tells
the three formats apart. Pure Python: no database, no network."""
