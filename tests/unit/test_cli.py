"""The ``het`` command (het.cli): each subcommand's module registers its flags and entry point;
bad input is one line and exit code 2."""

import argparse
import importlib
import subprocess
import sys

import pytest

from het import cli

COMMANDS = {"train": "het.train.cli", "export": "het.export.cli", "predict": "het.export.predict_cli",
            "serve-model": "het.online.cli", "serve": "het.serve", "reshard": "het.ps.reshard", "data": "het.data.prepare",
            "bench": "het.bench", "demo": "het.demo"}


def out_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_command_in_order_with_its_help(capsys):
    text = out_of(["--help"], capsys)
    assert " ".join(text.split()).startswith("usage: het [-h] {train,export,predict,serve-model,serve,reshard,data,bench,"
                                             "demo} ...")
    words = " ".join(text.split())
    for command, line in (("train", "train a model: a local cluster by default"), ("export", "a training checkpoint "
                          "-> a self-contained model directory"), ("predict", "score a data set with an export"),
                          ("serve", "run one PS shard in "
                          "the foreground"), ("data", "describe and prepare data sets"), ("bench", "benchmarks; each prints one "
                          "JSON object with --json")):
        assert f"{command} {line}" in words, command


def test_each_module_registers_its_command():
    assert list(cli.COMMANDS.items()) == list(COMMANDS.items())  # the order `het --help` lists them in
    for command, module in COMMANDS.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).add_parser(sub)
        assert list(sub.choices) == [command], module


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_prints_its_own_usage(command, capsys):
    assert out_of([command, "--help"], capsys).startswith(f"usage: het {command} ")


def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys):
    (tmp_path / "job.toml").write_text("workers = 0\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--config", str(tmp_path / "job.toml"), "--quiet"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("het train: error: ") and len(err.strip().splitlines()) == 1, err


def test_the_command_line_is_built_without_the_heavy_optional_libraries():
    """Every het process (the launcher, each shard, each worker) builds the command line first: the
    libraries only some commands need (scikit-learn, pandas, scipy; 1.4 s of a start) load where
    they are used, not with the parser."""
    heavy = ("sklearn", "pandas", "scipy", "lightgbm", "deepctr_torch", "polars")
    code = ("import sys; from het import cli; cli.parser(); "
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_launcher_starts_its_workers_and_shards_without_torch(tmp_path):
    """``het train``'s launcher parses, checks and starts every process with no torch loaded
    (1.5-2 s of a start, on the path to the first step): the workers and the shards import it
    side by side, and each shard makes the job's tables itself."""
    code = ("import sys; import het.dist.launch as launch\n"
            "def started(self, *a, **k):\n"
            "    print('torch' in sys.modules, len(self.servers), len(self.workers)); raise SystemExit(0)\n"
            "launch.LocalCluster._watch = started\n"
            f"from het.cli import main; main(['train', '--steps', '5', '--quiet', '--log-dir', {str(tmp_path)!r}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False 1 2", out.stdout + out.stderr[-2000:]
    code = "import sys; from het import cli; cli.parser('train'); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
