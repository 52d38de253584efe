"""`het bench profile`'s share of a step spent in het's machinery (het.bench.profile.het_seconds)."""

import cProfile
import importlib.util
import pstats
import sys

from het.bench.profile import het_seconds, is_het

JOB = '''
def busy():
    return sum(range(20_000))

def trampoline(f):  # as autograd's apply runs het's forward: outside het, called by het
    return f()

def step(het):
    het.entry()
    busy()
'''

HET = '''
from job import busy, trampoline

def inner():
    return busy()

def entry():
    trampoline(inner)
    busy()
'''


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_a_call_into_het_counts_once_with_all_it_calls(tmp_path, monkeypatch):
    """het's time is its entry's whole time: the outside functions it calls (``busy``), and a
    call back into het through an outside function (``trampoline``) not counted again; the
    job's own ``busy`` left out."""
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "het" / "cache").mkdir(parents=True)
    (tmp_path / "het" / "cache" / "fake.py").write_text(HET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "job", raising=False)
    job = load("job", tmp_path / "job.py")
    fake = load("fake_het_module", tmp_path / "het" / "cache" / "fake.py")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        job.step(fake)
    profiler.disable()
    stats = pstats.Stats(profiler)
    entry = next(f for f in stats.stats if f[2] == "entry")
    step = next(f for f in stats.stats if f[2] == "step")
    assert is_het(entry) and not is_het(step)
    entry_time = stats.stats[entry][3]
    assert 0 < entry_time < stats.stats[step][3]
    assert abs(het_seconds(stats) - entry_time) <= 1e-9 * max(1.0, entry_time)


def test_a_call_into_het_from_a_frame_older_than_the_profiler_counts_whole(tmp_path, monkeypatch):
    """A profiler enabled in the middle of a run (``het bench profile``'s window) knows no
    caller for calls made from frames already running: they are calls into het from outside it."""
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "het" / "cache").mkdir(parents=True)
    (tmp_path / "het" / "cache" / "fake.py").write_text(HET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "job", raising=False)
    load("job", tmp_path / "job.py")
    fake = load("fake_het_module", tmp_path / "het" / "cache" / "fake.py")
    profiler = cProfile.Profile()
    profiler.enable()  # this frame is older than the profiler: entry's calls have no caller on record
    for _ in range(5):
        fake.entry()
    profiler.disable()
    stats = pstats.Stats(profiler)
    entry = next(f for f in stats.stats if f[2] == "entry")
    assert stats.stats[entry][4] == {} and stats.stats[entry][3] > 0
    assert abs(het_seconds(stats) - stats.stats[entry][3]) <= 1e-9 * max(1.0, stats.stats[entry][3])


def test_the_profiled_window_holds_no_step_of_the_tail():
    """The profiled steps are the job's steady state: the tail's idle pushes (the last
    ``lookahead`` steps but one) and the final flush run after the window, timed apart."""
    from het.bench.profile import run
    from het.train.config import SyntheticConfig, TrainConfig

    cfg = TrainConfig(dim=8, batch=64, synthetic=SyntheticConfig(cap=2000), cache={"lookahead": 3}, eval_samples=0, workers=1)
    result = run(cfg, steps=5, warmup=2, top=10_000)
    profiled = {r["function"] for r in result["by_cumtime"]}
    assert any(f.endswith("(push_sync)") for f in profiled)  # the steps' syncs are in it
    assert not any(f.endswith(("(push_idle)", "(flush)")) for f in profiled)
    assert result["tail_steps"] == 4 and result["tail_s_per_step"] > 0 and result["flush_s"] > 0
