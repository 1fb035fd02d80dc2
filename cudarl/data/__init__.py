"""Market bars in: reading, strict validation, opt-in repairs, and the data report.

    bars = cudarl.data.load("spx.csv")              # strict: raises DataError on bad data
    bars = cudarl.data.load("builtin:regime?seed=3")
    bars = cudarl.data.from_pandas(df)             # a DataFrame (or from_arrow(table))
    cudarl.data.write_report(bars, "data_report.json")

See docs/data.md for the formats, every error and the option that repairs it.
"""

from .bars import Bars, DataError, Problem, infer_periods_per_year
from .io import parse_times, write_csv
from .validate import check, from_arrow, from_pandas, load, report, write_json_atomic, write_report

__all__ = [
    "Bars",
    "DataError",
    "Problem",
    "load",
    "from_pandas",
    "from_arrow",
    "check",
    "report",
    "write_report",
    "write_json_atomic",
    "parse_times",
    "write_csv",
    "infer_periods_per_year",
]
