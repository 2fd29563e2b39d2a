"""The job spec's pure pieces: parsing and validation, on literals."""

from __future__ import annotations

import pytest

from kit import submission as launch
from kit.core import jobfile
from kit.core import spec as specs
from kit.errors import KitError


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("30", 1800),
        ("1:30", 90),
        ("2:00:00", 7200),
        ("1-0", 86400),
        ("1-12", 129600),
        ("1-12:30", 131400),
        ("1-12:30:15", 131415),
        ("90", 5400),
    ],
)
def test_parse_time(text, seconds):
    assert specs.parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "abc", "1:2:3:4", "1-25", "1:60", "-1", "1h", "0:00:00"])
def test_parse_time_rejects(text):
    with pytest.raises(KitError):
        specs.parse_time(text)


@pytest.mark.parametrize("text,norm", [("64G", "64G"), ("16000", "16000"), ("512m", "512M"), ("1T", "1T")])
def test_parse_mem(text, norm):
    assert specs.parse_mem(text) == norm


@pytest.mark.parametrize("text", ["", "0", "0G", "1.5G", "G", "12X", "-1G"])
def test_parse_mem_rejects(text):
    with pytest.raises(KitError):
        specs.parse_mem(text)


def test_defaults():
    job = launch.resolve(specs.JobSpec(command=["true"]), cwd=None)
    s = job.spec
    assert (s.nodes, s.gpus_per_node, s.ntasks_per_node, s.signal, s.signal_lead, s.max_restarts) == (
        1,
        0,
        1,
        "USR1",
        90,
        3,
    )
    assert (job.port_low, job.port_high) == (29500, 30499)


def test_tasks_default_to_gpus():
    assert launch.resolve(specs.JobSpec(command=["x"], gpus_per_node=4)).spec.ntasks_per_node == 4
    # One per-node launcher (torchrun) is allowed too.
    assert launch.resolve(specs.JobSpec(command=["x"], gpus_per_node=4, ntasks_per_node=1)).spec.ntasks_per_node == 1


def test_devices_in_command_must_match_tasks_per_node():
    with pytest.raises(KitError) as e:
        launch.resolve(specs.JobSpec(command=["python", "train.py", "--devices", "4"], ntasks_per_node=2))
    assert e.value.field == "command"
    assert "--devices 4" in e.value.message
    launch.resolve(specs.JobSpec(command=["python", "train.py", "--trainer.devices=2"], ntasks_per_node=2))


def test_merge_command_line_wins_and_env_merges():
    base = specs.JobSpec(nodes=4, env={"A": "1", "B": "2"})
    origins = specs.Origins(nodes="job.toml: nodes", env="job.toml: env")
    merged, o = specs.merge(base, specs.JobSpec(nodes=2, env={"B": "3"}), origins)
    assert merged.nodes == 2 and merged.env == {"A": "1", "B": "3"}
    assert o.label("nodes") == "--nodes" and o.label("time") == "--time"


def test_kit_variables_are_reserved_except_the_documented_one():
    with pytest.raises(KitError, match="names starting with KIT_ or SLURM_ are reserved"):
        launch.resolve(specs.JobSpec(command=["true"], env={"KIT_JOB_DIR": "/x"}))
    job = launch.resolve(specs.JobSpec(command=["true"], env={"KIT_EXPORTER_NAMING": "compat"}))
    assert job.spec.env == {"KIT_EXPORTER_NAMING": "compat"}
    assert (job.spec.stop_grace, job.spec.hang_timeout, job.spec.first_progress_timeout) == (3, 900, 3600)


def test_acting_on_stragglers_without_the_exporter_that_names_them_is_refused(tmp_path):
    """--on-straggler requeue/restart with --no-exporter would never act (the verdicts are the exporter's): one
    message naming both, exit 2, nothing written; telling only (the default) stays allowed."""
    from helpers import kit

    out = tmp_path / "jobs"
    for action in ("requeue", "restart"):
        proc = kit(
            "launch", "--dry-run", "--output-dir", str(out), "--no-exporter", "--on-straggler", action, "--", "true"
        )
        assert proc.returncode == 2 and proc.stderr.startswith(
            f"kit: --on-straggler: {action} acts on the exporter's straggler verdicts; the job runs none (--no-exporter)"
        ), proc.stderr
        assert "Traceback" not in proc.stderr and not out.exists()
    (tmp_path / "job.toml").write_text('command = ["true"]\nexporter = false\non_straggler = "restart"\n')
    spec, origins = jobfile.load_job_file(tmp_path / "job.toml")
    with pytest.raises(
        KitError, match=r"restart acts on the exporter's straggler verdicts; the job runs none \(.*job.toml: exporter\)"
    ):
        launch.resolve(spec, origins)
    told = launch.resolve(specs.JobSpec(command=["true"], exporter=False, on_straggler="tell"))
    assert told.spec.on_straggler == "tell"


def test_an_environment_value_over_linux_limit_is_refused():
    with pytest.raises(KitError, match=r"BIG: the value is 131072 bytes; Linux passes at most 131071 bytes"):
        launch.resolve(specs.JobSpec(command=["true"], env={"BIG": "x" * 131072}))
    assert launch.resolve(specs.JobSpec(command=["true"], env={"OK": "x" * 100_000})).spec.env["OK"]


def test_a_command_over_linux_limits_is_refused():
    with pytest.raises(KitError, match=r"a command argument is 131072 bytes; Linux passes at most 131071 bytes"):
        launch.resolve(specs.JobSpec(command=["echo", "y" * 131072]))
    with pytest.raises(KitError, match=r"the command and --env values come to 1200013 bytes; kit allows 1048576"):
        launch.resolve(specs.JobSpec(command=["echo"] + ["y" * 99_999] * 12, env={"A": "b" * 5}))
    assert launch.resolve(specs.JobSpec(command=["echo"] + ["y" * 99_999] * 10)).spec.command


def test_the_time_limit_sbatch_gets_is_the_one_checked():
    assert launch.resolve(specs.JobSpec(command=["true"], time="10\n")).spec.time == "10"


def test_prometheus_targets_under_an_image_must_be_a_plain_mount_path(tmp_path):
    image = tmp_path / "x.sqsh"
    image.write_bytes(b"hsqs" + b"\0" * 100)
    for bad in ("/a,/b:/injected", "/a b", "/a:b"):
        with pytest.raises(KitError, match="the targets directory"):
            launch.resolve(specs.JobSpec(command=["true"], image=str(image), prometheus_targets=bad))


def test_a_job_file_sweep_table_and_after_list(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text(
        'command = ["train", "--lr={lr}"]\nafter = ["12", "13:any"]\narray = "%1"\n'
        '[sweep]\nlr = [0.1, 0.01]\nopt = ["adam", "sgd"]\n'
    )
    spec, origins = jobfile.load_job_file(f)
    merged, origins = specs.merge(spec, specs.JobSpec(sweep={"opt": ["lion"]}), origins)
    job = launch.resolve(merged, origins)
    assert job.spec.sweep == {"lr": ["0.1", "0.01"], "opt": ["lion"]}  # --sweep wins per name
    assert job.tasks.render() == "0-1%1" and list(job.params) == [
        {"lr": "0.1", "opt": "lion"},
        {"lr": "0.01", "opt": "lion"},
    ]
    assert [specs.parse_after(a, "after") for a in job.spec.after] == [("12", "ok"), ("13", "any")]
    f.write_text('command = ["x"]\n[sweep]\nlr = "0.1"\n')
    with pytest.raises(KitError, match="expected a table of lists"):
        jobfile.load_job_file(f)
    f.write_text('command = ["x"]\n[sweep]\nlr = [true]\n')
    with pytest.raises(KitError, match="lr: values are strings or numbers"):
        jobfile.load_job_file(f)


def test_a_checked_plan_cannot_be_assigned_and_keeps_what_the_user_asked(tmp_path, monkeypatch):
    """plan's value is final: the spec resolve checked refuses assignment, and what is decided after the
    check (the pinned image, the checked dependencies) are fields of their own, set by dataclasses.replace."""
    import dataclasses

    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"hsqs" + bytes(200))
    spec = specs.JobSpec(
        command=["true"], image=str(image), after=["123:ok"], output_dir=str(tmp_path / "out"), code_snapshot=False
    )
    planned = launch.plan(spec, cwd=tmp_path).job  # a dry run: the image hashed, not copied
    with pytest.raises(dataclasses.FrozenInstanceError):
        planned.spec.image = "/elsewhere.sqsh"
    with pytest.raises(dataclasses.FrozenInstanceError):
        del planned.spec.image
    with pytest.raises(dataclasses.FrozenInstanceError):
        planned.image = "/elsewhere.sqsh"
    again = dataclasses.replace(planned.spec, nodes=3)  # a new checked spec, the old one as it was
    assert type(again) is type(planned.spec) and again.nodes == 3 and planned.spec.nodes == 1
    assert again.image == planned.spec.image and again != planned.spec
    assert planned.spec.after == ["123:ok"] and planned.after == ("123:ok",)
    pinned = launch.pin_code_and_image(launch.resolve(spec, cwd=tmp_path), specs.Origins(), launch.Rerun())
    assert pinned.spec.image == str(image) == pinned.image_source
    assert pinned.image == str(tmp_path / "home" / "images" / f"sha256-{pinned.image_digest[7:]}.sqsh")
    record = launch.spec_record(dataclasses.replace(pinned, after=planned.after))
    assert record["image"] == pinned.image and record["after"] == ["123:ok"]


def test_restarting_on_failure_a_command_that_may_report_no_checkpoint_is_warned():
    """docs/endings.md: the stall rule sees only a checkpoint step reported; a command reporting none is restarted
    until --max-restarts is spent (50 restarts of a command that always exits 3: 51 runs). kit launch says so at
    submission, but not for the reference trainer, which reports one, nor without --on-failure restart."""

    def warned(command, **kw):
        job = launch.resolve(specs.JobSpec(command=command, **kw))
        return [w for w in job.warnings if "restarted after every failure" in w]

    [warning] = warned(["bash", "-c", "exit 3"], on_failure="restart", max_restarts=50)
    assert warning.startswith("--on-failure restart: a command that reports no checkpoint step") and "50" in warning
    assert warned(["python3", "-m", "kit.train"], on_failure="restart", max_restarts=50) == []
    assert warned(["bash", "-c", "exit 3"], max_restarts=50) == []
    assert warned(["bash", "-c", "exit 3"], on_failure="restart", max_restarts=0) == []
