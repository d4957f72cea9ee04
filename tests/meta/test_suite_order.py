"""The suite's own order (conftest.py): the tests measured longest start first, one per xdist
worker, so none of them is stolen late and runs alone at the end."""
import subprocess
import sys
from pathlib import Path

conftest = sys.modules["conftest"]      # the repository root's, loaded by pytest before any test
ROOT = Path(conftest.__file__).parent


def test_every_listed_long_test_is_collected():
    """A renamed or removed test left in the list would silently lose its place at the front.
    (Its parameters are not checked: they follow the implementations registered here, and
    flex's exist only on CUDA.)"""
    files = sorted({part.split("::")[0] for part in conftest._LONGEST})
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                             "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True, text=True)
    collected = [line for line in listed.stdout.splitlines() if "::" in line]
    assert listed.returncode == 0 and collected, listed.stdout + listed.stderr
    for part in conftest._LONGEST:
        test = part.partition("[")[0]
        assert any(test in nodeid.partition("[")[0] for nodeid in collected), part


def test_the_longest_come_first_then_compiled_campaigns_then_processes():
    ids = ["tests/judging/test_engine.py::test_y", "tests/cli/test_cli.py::test_x",
           "tests/kernels/test_differential.py::test_matches_oracle[flex-float16]",
           "tests/kernels/test_differential.py::test_matches_oracle[torch_tiled-float16]",
           "tests/user_facing/test_autotuned_example.py::test_one_fuzz_run_reports_every_seeded_defect_once"]
    ordered = sorted(ids, key=conftest.rank)
    assert ordered == [ids[4], ids[2], ids[1], ids[0], ids[3]]


def test_dealing_puts_one_long_test_at_the_front_of_each_slice_and_keeps_every_test():
    items = [f"long{i}" for i in range(5)] + [f"short{i}" for i in range(15)]
    long = [name.startswith("long") for name in items]
    dealt = conftest._dealt(items, long, workers=4)
    assert sorted(dealt) == sorted(items)
    slices = [dealt[i * 5:(i + 1) * 5] for i in range(4)]      # worksteal's contiguous slices
    assert [part[0] for part in slices] == ["long0", "long1", "long2", "long3"]
    assert slices[0][1] == "long4"                              # the fifth goes round again
    assert conftest._dealt(items, long, workers=1) == items
