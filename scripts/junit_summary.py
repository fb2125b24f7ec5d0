"""Add up the per-database JUnit files into one closing line; fail when nothing ran."""

import sys
import xml.etree.ElementTree as ET

totals = {"passed": 0, "failed": 0, "skipped": 0}
per_db = []
for path in sys.argv[1:]:
    root = ET.parse(path).getroot()
    for suite in root.iter("testsuite"):
        tests, failures, errors, skipped = (
            int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")
        )
        passed = tests - failures - errors - skipped
        totals["passed"] += passed
        totals["failed"] += failures + errors
        totals["skipped"] += skipped
        per_db.append(f"{suite.get('name')}: {passed} passed, {failures + errors} failed, {skipped} skipped")
for line in per_db:
    print("  " + line)
print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
sys.exit(1 if totals["failed"] or not totals["passed"] else 0)
