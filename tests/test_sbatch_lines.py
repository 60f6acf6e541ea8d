"""The sbatch line the installed SLURM plugin builds for each rule, from the resources that
Snakemake resolves with profiles/slurm (no cluster needed): a plugin change shows up here."""

import re
from importlib.metadata import version

import pytest
from conftest import REPO, run, snakemake_bin

PLUGIN_FLOOR = (2, 7, 1)  # earlier versions add --ntasks-per-gpu to GPU jobs (refused beside gres)


class Resources(dict):
    """Snakemake's resources: by key or attribute (a missing attribute raises AttributeError)."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class Job:
    """What the plugin's submit-string builder reads of a job."""

    def __init__(self, name, resources, threads):
        self.name, self.resources, self.threads, self.wildcards = name, Resources(resources), threads, {}


def value(text):
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def dry_run(tmp_path, profile="profiles/slurm", *config) -> str:
    return run(
        [snakemake_bin(), "--profile", str(profile), "-n", "--config", f"results={tmp_path / 'r'}", *config],
        timeout=120,
    ).stdout


def planned_jobs(out: str) -> dict:
    """{(rule, wildcards): Job} of a dry run's output."""
    jobs = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        head = re.match(r"(?:local)?rule (\w+):", block)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        if not head or not res:
            continue
        wildcards = (re.search(r"^\s+wildcards: (.*)$", block, re.M) or [None, ""])[1]
        threads = int((re.search(r"^\s+threads: (\d+)$", block, re.M) or [None, "1"])[1])
        resources = {k: value(v) for k, _, v in (item.partition("=") for item in res[1].split(", ")) if v != "<TBD>"}
        jobs[(head[1], wildcards)] = Job(head[1], resources, threads)
    return jobs


def sbatch_line(job: Job) -> str:
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    validate_slurm_extra(job)
    params = {
        "run_uuid": "uuid",
        "slurm_logfile": "/logs/job.log",
        "comment_str": f"rule_{job.name}",
        "account": f"-A '{job.resources['slurm_account']}'",
        "partition": f"-p '{job.resources['slurm_partition']}'",
        "workdir": "/work",
    }
    return get_submit_command(job, params) + set_gres_string(job)


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """Every job of the default DAG, each cell's pretraining on 2 nodes of 4 GPUs."""
    jobs = planned_jobs(dry_run(tmp_path_factory.mktemp("sbatch"), "profiles/slurm", "grid={resources: {nodes: 2}}"))
    return {key: sbatch_line(job) for key, job in jobs.items()}


def test_the_installed_plugin_is_at_least_the_floor():
    installed = tuple(int(x) for x in version("snakemake-executor-plugin-slurm").split(".")[:3])
    assert installed >= PLUGIN_FLOOR
    floor = re.search(r"snakemake-executor-plugin-slurm>=([\d.]+)", (REPO / "requirements.txt").read_text())[1]
    assert tuple(int(x) for x in floor.split(".")) == PLUGIN_FLOOR


def test_pretraining_spans_two_nodes_of_four_gpus(lines):
    line = lines[("pretrain", "cell=base")]
    for part in (
        "-p 'gpu'",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gres=gpu:4",
        "--cpus-per-task=8",
        "--mem 256000",
        "--signal=USR1@180",
        "-A 'my_account'",
    ):
        assert part in line, (part, line)
    assert "--ntasks-per-gpu" not in line and " -C " not in line, line


def test_probe_and_detect_ask_for_one_gpu_and_no_constraint(lines):
    for rule, cell in (("probe", "cell=base"), ("detect", "cell=base, trial=0")):
        line = lines[(rule, cell)]
        assert "--gres=gpu:1" in line and "-p 'gpu'" in line, line
        assert " -C " not in line and "--ntasks-per-gpu" not in line, line
    assert "-t 240" in lines[("probe", "cell=base")] and "-t 480" in lines[("detect", "cell=base, trial=0")]


def test_the_random_baseline_is_a_small_cpu_job(lines):
    line = lines[("pretrain_random_init", "cell=method=random")]
    assert "-p 'cpu'" in line and "--gres" not in line and "--nodes=1" in line, line
    assert "--cpus-per-task=2" in line and "--mem 8000" in line and "-t 15" in line, line


def test_the_one_gpu_per_node_recipe_builds_a_clean_line(lines, tmp_path):
    """The README's recipe for nodes with one GPU each (tasks, tasks_per_gpu 0)."""
    from pipeline.launch import srun_prefix

    profile = tmp_path / "profile"
    profile.mkdir()
    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    recipe = re.search(r"```yaml\n(  pretrain:\n.*?)```", (REPO / "README.md").read_text(), re.S)[1]
    text, replaced = re.subn(r"\n  pretrain:[^\n]*\n(?:    [^\n]*\n)*", "\n" + recipe, text)
    assert replaced == 1
    (profile / "config.yaml").write_text(text)
    job = planned_jobs(dry_run(tmp_path, profile))[("pretrain", "cell=base")]
    resources = job.resources
    line = sbatch_line(job)
    assert "--nodes=4" in line and "--ntasks=4" in line and "--gres=gpu:1" in line, line
    assert "--ntasks-per-gpu" not in line and "--ntasks-per-node" not in line, line
    assert srun_prefix(resources).startswith("srun --nodes=4 --ntasks=4")
