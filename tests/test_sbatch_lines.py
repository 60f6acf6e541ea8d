"""The parts of profiles/slurm's sbatch lines that the local test cluster cannot submit, built by
the installed plugin's own functions from the resources Snakemake resolves (no cluster needed).

tests/test_slurm.py submits the site profile for real and checks every recorded sbatch line
(partitions, time limits, memory, cores, requeue, the pretraining's nodes, ranks per node and
warning signal, kept logs); it overrides only the account, the gres and the sizes two small
nodes cannot hold (tests/site_profile.py). Those site values are checked here: the GPUs per
node and per job, the account, the pretraining's cores and memory, and the recipe of
docs/cluster.md for nodes with one GPU each."""

import re
from importlib.metadata import version

import pytest
from conftest import REPO, run, snakemake_cli

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
        [*snakemake_cli(), "--profile", str(profile), "-n", "--config", f"results={tmp_path / 'r'}", *config],
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


def test_the_site_values_the_test_cluster_overrides(lines):
    """Pretraining on 2 nodes of 4 GPUs with 8 cores and 256000 MB per node, the one-GPU jobs
    with gpu:1, all with the account: the x-site values of profiles/slurm."""
    line = lines[("pretrain", "cell=base")]
    for part in ("--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", "--cpus-per-task=8", "--mem 256000"):
        assert part in line, (part, line)
    for rule, cell in (("probe", "cell=base"), ("detect", "cell=base, trial=0")):
        assert "--gres=gpu:1" in lines[(rule, cell)], lines[(rule, cell)]
    for line in lines.values():
        assert "-A 'my_account'" in line, line
        assert "--ntasks-per-gpu" not in line and " -C " not in line, line


@pytest.mark.integration
def test_the_one_gpu_per_node_recipe_builds_a_clean_line(lines, tmp_path):
    """docs/cluster.md's recipe for nodes with one GPU each (tasks, tasks_per_gpu 0)."""
    from pipeline.launch import srun_prefix

    profile = tmp_path / "profile"
    profile.mkdir()
    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    recipe = re.search(r"```yaml\n(  pretrain:\n.*?)```", (REPO / "docs" / "cluster.md").read_text(), re.S)[1]
    text, replaced = re.subn(r"\n  pretrain:[^\n]*\n(?:    [^\n]*\n)*", "\n" + recipe, text)
    assert replaced == 1
    (profile / "config.yaml").write_text(text)
    job = planned_jobs(dry_run(tmp_path, profile))[("pretrain", "cell=base")]
    resources = job.resources
    line = sbatch_line(job)
    assert "--nodes=4" in line and "--ntasks=4" in line and "--gres=gpu:1" in line, line
    assert "--ntasks-per-gpu" not in line and "--ntasks-per-node" not in line, line
    assert srun_prefix(resources).startswith("srun --nodes=4 --ntasks=4")
