"""`ballast train`'s configuration, schedule, metrics history and checkpoint bookkeeping (no ranks)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tomllib

import pytest

import ballast
from ballast.train import checkpoint_files
from ballast.train.config import TrainConfig, field_range
from ballast.train.config_sources import _scalar_type, add_arguments, field_docs, from_args, load_toml
from ballast.train.metrics import final_history, summarise
from ballast.train.loop import learning_rate
from ballast.pricing.cost_sources import analytic_cost


def parse(*argv: str) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(list(argv)))


def test_defaults_and_headline_flags():
    config = parse("--model", "tiny", "--data", "stdlib", "--planner", "ballast", "--world", "2",
                   "--steps", "50")
    assert (config.model.model, config.data.source, config.planner.planner) == ("tiny", "stdlib", "ballast")
    assert (config.run.world, config.run.steps) == (2, 50)
    assert config.optimizer == TrainConfig().optimizer


def test_toml_then_flags_override(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[data]\nsource = "jsonl:/data"\nmax_len = 512\n\n[planner]\nplanner = "static"\n'
                    'device_memory_gb = 1\n\n[optimizer]\nzero1 = true\n\n[run]\nsteps = 7\n')
    config = parse("--config", str(path), "--steps", "9", "--no-zero1", "--lr", "1e-4")
    assert config.data.source == "jsonl:/data" and config.data.max_len == 512
    assert config.planner.planner == "static"
    assert config.planner.device_memory_gb == 1.0 and isinstance(config.planner.device_memory_gb, float)
    assert config.run.steps == 9 and config.optimizer.zero1 is False and config.optimizer.lr == 1e-4
    assert config.data.tokens_per_step == TrainConfig().data.tokens_per_step  # untouched: default


def test_written_config_reads_back(tmp_path):
    config = parse("--planner", "dcp", "--steps", "3", "--checkpoint-dir", "/ckpt", "--degree", "2")
    path = tmp_path / "config.toml"
    path.write_text(config.to_toml())
    assert load_toml(path) == config


@pytest.mark.parametrize("text, message", [
    ("[run]\nstep = 3\n", "unknown key 'step' in [run]"),
    ("[training]\nsteps = 3\n", "unknown section [training]"),
    ('[run]\nsteps = "3"\n', "[run] steps: expected int"),
    ("[run\n", "not valid TOML"),
])
def test_bad_toml_is_a_value_error(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        load_toml(path)


def test_invalid_values_are_value_errors():
    with pytest.raises(ValueError, match="exceeds --tokens-per-step"):
        parse("--max-len", "4096", "--tokens-per-step", "1024")


@pytest.mark.parametrize("section, name, value, message", [
    ("run", "steps", 0, r"--steps must be an integer > 0, got 0"),
    ("run", "world", 0, r"--world must be an integer > 0, got 0"),
    ("planner", "device_memory_gb", math.inf, r"--device-memory-gb must be a finite number > 0, got inf"),
    ("optimizer", "lr", math.nan, r"--lr must be a finite number > 0, got nan"),
    ("data", "max_len", 1, r"--max-len must be an integer >= 2 \(a 1-token sample has no context to attend to\)"),
    ("run", "timeout", math.inf, r"--timeout must be a finite number >= 30"),
    ("optimizer", "bucket_mb", 0, r"--bucket-mb must be a finite number >= .* \(a bucket holds at least a byte\), got 0"),
])
def test_a_config_files_values_take_the_flags_ranges(section, name, value, message):
    """A value from a TOML file or the Python API meets the range its flag's type checks."""
    config = TrainConfig()
    setattr(getattr(config, section), name, value)
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_every_numeric_field_has_a_range():
    for section in dataclasses.fields(TrainConfig):
        cls = type(getattr(TrainConfig(), section.name))
        for f in dataclasses.fields(cls):
            if _scalar_type(cls, f.name) in (int, float):
                assert field_range(f) is not None, (section.name, f.name)


def test_every_field_has_a_docstring_and_a_flag():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {option for action in parser._actions for option in action.option_strings}
    for section in dataclasses.fields(TrainConfig):
        cls = type(getattr(TrainConfig(), section.name))
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{section.name}.{f.name} has no docstring"
            assert f.metadata.get("flag", "--" + f.name.replace("_", "-")) in flags


def test_learning_rate_warms_up_then_decays_to_min():
    opt = TrainConfig().optimizer
    lrs = [learning_rate(k, 100, opt) for k in range(100)]
    assert lrs[0] == pytest.approx(opt.lr / opt.warmup_steps)
    assert max(lrs) == pytest.approx(opt.lr)
    assert lrs[-1] == pytest.approx(opt.lr / 10) and opt.min_lr is None  # the default: --lr / 10
    assert all(a >= b for a, b in zip(lrs[opt.warmup_steps:], lrs[opt.warmup_steps + 1:]))
    # A fixed decay horizon makes the schedule independent of the run length.
    fixed = dataclasses.replace(opt, decay_steps=100)
    assert [learning_rate(k, 30, fixed) for k in range(30)] == lrs[:30]


def test_final_history_keeps_the_last_record_of_each_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [(0, 0, 5.0), (1, 0, 4.0), (2, 0, 3.9), (2, 1, 3.0), (3, 1, 2.0)]  # step 2 re-run
    path.write_text("".join(json.dumps({"step": s, "attempt": a, "loss": l, "tokens": 10,
                                        "step_time": 1.0, "predicted_step_time": 0.5,
                                        "idle_fraction": 0.1, "plan_ms": 1.0, "plan_wait_ms": 0.0}) + "\n"
                            for s, a, l in records))
    history = final_history(path)
    assert [(r["step"], r["attempt"], r["loss"]) for r in history] == [(0, 0, 5.0), (1, 0, 4.0), (2, 1, 3.0), (3, 1, 2.0)]
    summary = summarise(history)
    assert summary["attempts"] == 2 and summary["tokens"] == 40 and summary["tokens_per_s"] == 10.0


def test_only_committed_checkpoints_count(tmp_path):
    """A crash mid-write leaves a temporary folder: never resumed from. A committed folder
    without meta.json is a damaged checkpoint, not none (`resumable` skips it, saying so)."""
    for name, meta in [("step-00000002", True), ("step-00000004", True), (".tmp-step-00000006", True),
                       ("step-00000008", False), ("step-notanumber", True)]:
        (tmp_path / name).mkdir()
        if meta:
            (tmp_path / name / checkpoint_files.META).write_text("{}")
    assert [p.name for p in checkpoint_files.committed(tmp_path)] == ["step-00000002", "step-00000004", "step-00000008"]
    assert checkpoint_files.latest(tmp_path).name == "step-00000008"
    assert checkpoint_files.latest(tmp_path / "missing") is None
    with pytest.raises(checkpoint_files.Damaged, match=r"step-00000008: meta.json is missing"):
        checkpoint_files.check(tmp_path / "step-00000008")


def test_toml_of_defaults_is_valid_toml():
    data = tomllib.loads(TrainConfig().to_toml())
    assert set(data) == {f.name for f in dataclasses.fields(TrainConfig)}


def test_cost_model_from_a_profile_file(tmp_path):
    """--cost PATH loads a `ballast profile` JSON; one made for another model is refused."""
    from ballast.vocabulary.cluster import get_cluster
    from ballast.vocabulary.model_shape import get_model_shape
    from ballast.train.setup import Setup

    cluster = get_cluster("cpu", world_size=2, device_memory_gb=1.0)
    profiled = dataclasses.replace(analytic_cost(get_model_shape("tiny"), cluster), source="profiled")
    profiled.save(tmp_path / "tiny.json")
    config = parse("--cost", str(tmp_path / "tiny.json"))
    setup = Setup.of(config, world=2)
    assert setup.cost == profiled and "profiled" in setup.describe()
    assert Setup.of(parse(), world=2).cost.source == "analytic"
    with pytest.raises(ValueError, match="describes model 'tiny', not 'gpt-7b'"):
        Setup.of(parse("--cost", str(tmp_path / "tiny.json"), "--model", "gpt-7b"), world=2)


def test_cluster_defaults_to_cpu_on_cpu_ranks_and_to_the_gpus_preset_on_gpus():
    """Under NCCL `train` planned for the cpu preset without a word; the GPU's model now names the
    cluster when --cluster does not (the ranks pass torch.cuda.get_device_name; a name here)."""
    from ballast.train.setup import Setup

    assert Setup.of(parse(), world=2).cluster.name == "cpu"
    on_h100 = Setup.of(parse(), world=2, gpu_name="NVIDIA H100 80GB HBM3")
    assert (on_h100.cluster.name, on_h100.cluster.world_size, on_h100.cluster.value_bytes) == ("h100-2", 2, 2)
    assert Setup.of(parse("--cluster", "cpu"), world=2, gpu_name="NVIDIA H100 80GB HBM3").cluster.name == "cpu"
    with pytest.raises(ValueError, match="give --cluster"):
        Setup.of(parse(), world=2, gpu_name="NVIDIA GeForce RTX 4090")


def test_trainer_validates_before_any_rank_starts():
    config = TrainConfig()
    config.run.steps = 0
    with pytest.raises(ValueError, match="--steps must be an integer > 0"):
        ballast.Trainer(config)


def test_a_checkpoints_model_is_its_numbers_not_its_name(tmp_path):
    from ballast.vocabulary.model_shape import MODEL_PRESETS

    tiny = MODEL_PRESETS["tiny"]
    renamed = {"model": checkpoint_files.model_record(dataclasses.replace(tiny, name="moved", source="elsewhere"))}
    checkpoint_files.check_same_model(tmp_path, renamed, tiny)
    with pytest.raises(ValueError, match=r"holds another model: 'tiny' \(ballast's own\), not this run's 'tiny' "
                                         r"\(ballast's own\) \(hidden 128 there, 64 here\)"):
        checkpoint_files.check_same_model(tmp_path, {"model": checkpoint_files.model_record(tiny)},
                                    dataclasses.replace(tiny, hidden=64))
    checkpoint_files.check_same_model(tmp_path, {"data": {}}, tiny)  # no record (older ballast): left to check_model
    newer = {"model": {**checkpoint_files.model_record(tiny), "field_of_a_newer_ballast": 1}}
    checkpoint_files.check_same_model(tmp_path, newer, tiny)


def test_checksums_find_bytes_changed_at_the_same_size(tmp_path):
    from ballast.train import checksums

    for name, data in {"a.bin": b"x" * 100, "b.bin": b"y" * 10}.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / checksums.MANIFEST).write_text(checksums.manifest(
        {name: checksums.digest(tmp_path / name) for name in ("a.bin", "b.bin")}))
    assert checksums.verify(tmp_path) is None
    (tmp_path / "a.bin").write_bytes(b"x" * 50 + b"z" + b"x" * 49)
    assert checksums.verify(tmp_path) == "a.bin does not match its SHA-256 in sha256.json (its bytes changed after " \
                                        "it was written)"
    (tmp_path / "b.bin").unlink()
    (tmp_path / checksums.MANIFEST).write_text("{\"sha256\": [")
    assert checksums.verify(tmp_path).startswith("sha256.json is unreadable (JSONDecodeError")


def test_a_run_inside_its_warm_up_is_warned_about():
    config = TrainConfig()
    config.run.steps, config.optimizer.warmup_steps = 3, 10
    assert config.warnings() == [
        "the run's 3 step(s) end inside the 10-step warm-up (--warmup-steps): the rate rises to 30% of --lr 0.003 "
        "and never decays (to --min-lr 0.0003); give fewer --warmup-steps or more --steps"]
    config.optimizer.warmup_steps = 2
    assert config.warnings() == []


def test_the_summary_counts_the_steps_of_every_planner():
    records = [dict(step=k, attempt=0, planner="static" if k < 2 else "ballast", tokens=10, step_time=1.0,
                    predicted_step_time=1.0, idle_fraction=0.0, loss=1.0, plan_ms=1.0, plan_wait_ms=0.0)
               for k in range(5)]
    assert summarise(records)["steps_by_planner"] == {"static": 2, "ballast": 3}


def test_the_log_prints_a_cp_group_as_u_x_c(capsys):
    from rich.console import Console

    from ballast.train.metrics import ProgressDisplay, StepRecord

    record = StepRecord(step=0, attempt=0, planner="static", loss=1.0, grad_norm=1.0, skipped=False, lr=1e-3,
                        tokens=8, sample_ids=[0], lengths=[8], epoch=0, held=0, step_time=1.0, tokens_per_s=8.0,
                        predicted_step_time=1.0, idle_fraction=0.0, rank_idle=[0.0, 0.0], waves=1, micro_batches=1,
                        degrees=[2], context_parts=[2], splits=["1x2"], recomputed=0.0,
                        layout="1x2 recompute 0%", plan_ms=1.0, plan_wait_ms=0.0)
    display = ProgressDisplay(Console(force_terminal=False), 0, 1, 1)
    display.update(record)
    assert "layout 1x2 recompute 0%" in capsys.readouterr().out

