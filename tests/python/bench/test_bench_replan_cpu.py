"""scripts/bench_replan_cpu.py's walk of the re-plan pairs: every ordered pair of distinct plans
exactly once, each re-plan starting at the plan the previous one reached (one server walks it)."""
import itertools
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "scripts"))
import bench_replan_cpu  # noqa: E402


def test_pair_circuit_walks_every_ordered_pair_once():
    for plans in (["tp2", "ep2"], ["tp2", "ep2", "pp2"], ["tp2", "ep2", "pp2", "ep2-dp"]):
        walk = bench_replan_cpu.pair_circuit(plans)
        assert sorted(walk) == sorted(itertools.permutations(plans, 2)), walk
        assert walk[0][0] == plans[0], walk  # the server starts on the first plan
        assert all(a[1] == b[0] for a, b in zip(walk, walk[1:])), walk
