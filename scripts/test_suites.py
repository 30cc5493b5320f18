"""Prints the GoogleTest suites of a test binary whose tests live under the given folders of
tests/, one per line, from the binary's own listing: scripts select "the op tests" by folder, and
new suites are picked up without editing them.

    python scripts/test_suites.py build/bin/convnn_tests ops verify
"""
import json
import re
import subprocess
import sys
import tempfile


def suites_under(binary, folders):
    with tempfile.NamedTemporaryFile(suffix=".json") as listing:
        subprocess.run([binary, "--gtest_list_tests", f"--gtest_output=json:{listing.name}"],
                       check=True, stdout=subprocess.DEVNULL)
        tested = json.load(open(listing.name))["testsuites"]
    wanted = re.compile(r"(^|/)tests/(" + "|".join(map(re.escape, folders)) + r")/")
    return sorted({s["name"] for s in tested for t in s["testsuite"] if wanted.search(t["file"])})


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: test_suites.py TEST_BINARY FOLDER [FOLDER ...]")
    print("\n".join(suites_under(sys.argv[1], sys.argv[2:])))
