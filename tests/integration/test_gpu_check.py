"""benchmarks/gpu_check.sh's decisions, on a CPU machine: --dry-run with fake nvidia-smi scripts
(NVIDIA_SMI) plans the torch wheel for the driver, the Python, the CPU sets (from the affinity)
and the scale.py runs (1 rank; 2 ranks with 2 GPUs); a driver too old, a torch too old and a
bad option stop it in one line. And benchmarks/gpu_table.py's table from scale.py's JSON.
Nothing is installed or downloaded; a few seconds."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
H100 = "NVIDIA H100 80GB HBM3"

sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_table  # noqa: E402


def fake_smi(tmp_path: Path, cuda: str, gpus: int, name: str = H100) -> Path:
    """An executable that answers as nvidia-smi does (header, --query-gpu CSV, -L)."""
    driver = "570.86.15"
    listing = "\n".join(f"GPU {i}: {name} (UUID: GPU-{i:08d})" for i in range(gpus))
    csv = "\n".join(f"{driver}, {name}" for _ in range(gpus))
    path = tmp_path / "nvidia-smi"
    path.write_text(f"""#!/bin/sh
case "$1" in
  -L) cat <<'EOF'
{listing}
EOF
  ;;
  --query-gpu=*) cat <<'EOF'
{csv}
EOF
  ;;
  *) echo "+-----------------------------------------------------------------------------+"
     echo "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}     |"
  ;;
esac
""")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def quick_python(tmp_path_factory) -> str:
    """A PATH whose python3.12 is this Python: the script's first candidate answers at once
    (a version manager's shims take a quarter second each). The real PATH's search is run by
    the 12.4 test; the order and the 3.10 floor by test_a_python_older_than_3_10_is_refused."""
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python3.12").symlink_to(sys.executable)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.fixture
def fast(quick_python):
    """`run` with that PATH."""
    return lambda *args, **kw: run(*args, **kw, env={"PATH": quick_python})


def run(*args: str, smi: Path | None = None, prefix: tuple[str, ...] = (),
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH", "NVIDIA_SMI")}
    if smi is not None:
        base["NVIDIA_SMI"] = str(smi)
    cmd = [*prefix, "bash", str(SCRIPT), *args]
    return subprocess.run(cmd, env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)  # fmt: skip


def plan(p: subprocess.CompletedProcess) -> dict[str, str]:
    """The dry run's plan, `key: value` per line; it must have exited 0."""
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "gpu_check.sh --dry-run: nothing is installed or run"
    return dict(line.split(": ", 1) for line in lines[1:])


def flags(command: str) -> dict[str, str]:
    """A scale.py command line's `--flag value` pairs (after the script's path)."""
    argv = shlex.split(command)
    i = next(i for i, a in enumerate(argv) if a.endswith("scale.py")) + 1
    return dict(zip(argv[i::2], argv[i + 1 :: 2]))


def one_error_line(p: subprocess.CompletedProcess, code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = [x for x in p.stderr.splitlines() if not x.startswith("[gpu_check] ")]  # progress
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("gpu_check.sh: error: ")
    return lines[0]


def test_cuda_12_4_one_gpu_plans_pypi_cu124_and_one_rank(tmp_path):
    got = plan(run("--dry-run", smi=fake_smi(tmp_path, "12.4", 1)))
    assert got["driver"] == f"570.86.15, CUDA 12.4; GPUs: 1 x {H100}"
    assert got["torch"].startswith("pip install 'torch>=2.5,<2.7' from PyPI (the cu124 build")
    # a Python >= 3.10 that runs, and the new environment
    path, version = got["python"].split(" -> ")[0].rsplit(" ", 1)
    assert Path(path).is_file() and got["python"].endswith("-> a new .venv-gpu")
    assert tuple(int(x) for x in version.strip("()").split(".")[:2]) >= (3, 10)
    one = flags(got["run (1 rank)"])
    assert shlex.split(got["run (1 rank)"])[0] == ".venv-gpu/bin/python"
    assert one["--device"] == "cuda" and one["--nproc"] == "1"
    assert one["--sizes"] == "100M,300M"
    assert one["--out"] == "benchmarks/results/scale/gpu.json"
    assert "run (2 ranks)" not in got and got["run (island)"].startswith("none (1 GPU")
    res = "benchmarks/results/scale"
    table = shlex.split(got["table"])
    assert table[1:] == [
        "benchmarks/gpu_table.py",
        "--out",
        f"{res}/gpu_table.md",
        f"{res}/gpu.json",
    ]


def test_cuda_12_8_two_gpus_plans_cu128_and_a_two_rank_island(fast, tmp_path):
    got = plan(fast("--dry-run", "--quick", smi=fake_smi(tmp_path, "12.8", 2)))
    assert got["driver"].endswith("GPUs: 2 x " + H100)
    assert got["torch"].startswith("pip install 'torch>=2.8,<2.11' from PyPI (the cu128 build")
    assert "--index-url https://download.pytorch.org/whl/cu128" in got["torch"]
    one, two = flags(got["run (1 rank)"]), flags(got["run (2 ranks)"])
    assert (one["--nproc"], two["--nproc"]) == ("1", "2")
    assert two["--out"] == "benchmarks/results/scale/gpu_nproc2.json"
    assert one["--sizes"] == two["--sizes"] == "100M"  # --quick
    assert {k: v for k, v in one.items() if k not in ("--nproc", "--out")} == {
        k: v for k, v in two.items() if k not in ("--nproc", "--out")
    }
    assert got["table"].endswith("gpu.json benchmarks/results/scale/gpu_nproc2.json")
    # --nproc 1: no island; --nproc 3 with 2 GPUs: refused
    smi = fake_smi(tmp_path, "12.8", 2)
    assert "run (2 ranks)" not in plan(fast("--dry-run", "--nproc", "1", smi=smi))
    line = one_error_line(fast("--dry-run", "--nproc", "3", smi=smi), 1)
    assert "--nproc 3" in line and "2" in line


@pytest.mark.parametrize(("cuda", "spec", "build"), [
    ("12.4", "torch>=2.5,<2.7", "cu124"), ("12.5", "torch>=2.5,<2.7", "cu124"),
    ("12.6", "torch>=2.7,<2.8", "cu126"), ("12.8", "torch>=2.8,<2.11", "cu128"),
    ("12.9", "torch>=2.8,<2.11", "cu128"), ("13.0", "torch>=2.11,<2.15", "cu130"),
    ("13.1", "torch>=2.11,<2.15", "cu130"),
])  # fmt: skip
def test_the_table_picks_the_newest_build_the_driver_runs(fast, tmp_path, cuda, spec, build):
    got = plan(fast("--dry-run", smi=fake_smi(tmp_path, cuda, 1)))
    assert got["torch"].startswith(f"pip install '{spec}' from PyPI (the {build} build")


def test_cuda_11_8_driver_is_refused_in_one_line(fast, tmp_path):
    p = fast("--dry-run", smi=fake_smi(tmp_path, "11.8", 1))
    line = one_error_line(p, 1)
    assert "CUDA 11.8" in line and "12.4" in line
    assert "torch:" not in p.stdout and "run (1 rank)" not in p.stdout
    # no nvidia-smi at all and no --torch: one line too
    p = fast("--dry-run", smi=tmp_path / "absent")
    assert "cannot tell the driver's CUDA version" in one_error_line(p, 1)


def test_torch_and_index_url_override_the_table(fast, tmp_path):
    smi = fake_smi(tmp_path, "12.4", 1)
    got = plan(fast("--dry-run", "--torch", "torch==2.6.0", "--index-url",
                   "https://example.invalid/whl/cu124", smi=smi))  # fmt: skip
    want = "pip install 'torch==2.6.0' from https://example.invalid/whl/cu124 (--torch)"
    assert got["torch"] == want
    got = plan(fast("--dry-run", "--index-url=https://example.invalid/simple", smi=smi))
    assert got["torch"] == ("pip install 'torch>=2.5,<2.7' from https://example.invalid/simple "
                            "(the cu124 build)")  # fmt: skip
    # --torch goes past the table: an old driver with a build the user names
    got = plan(fast("--dry-run", "--torch", "torch==2.5.1", smi=fake_smi(tmp_path, "11.8", 1)))
    assert got["torch"].startswith("pip install 'torch==2.5.1' from PyPI")


def test_cpu_sets_split_this_process_affinity(fast, tmp_path):
    smi = fake_smi(tmp_path, "12.4", 1)
    mine = sorted(os.sched_getaffinity(0))
    got = plan(fast("--dry-run", smi=smi))
    _, train, comm = (part.split(" ")[-1] for part in got["cpus"].split("; "))
    assert got["cpus"].startswith("affinity " + ",".join(map(str, mine)) + ";")
    if len(mine) > 1:
        assert set(map(int, train.split(","))) | set(map(int, comm.split(","))) == set(mine)
        assert not set(train.split(",")) & set(comm.split(","))
    one = flags(got["run (1 rank)"])
    assert (one["--train-cpus"], one["--comm-cpus"]) == (train, comm)
    taskset = shutil.which("taskset")
    if taskset is None or len(mine) < 2 or 1 not in mine:
        pytest.skip("needs taskset and CPU 1 among two or more")
    got = plan(fast("--dry-run", smi=smi, prefix=(taskset, "-c", "1")))
    assert got["cpus"] == "affinity 1; training 1; comm and syncer 1"
    one = flags(got["run (1 rank)"])
    assert (one["--train-cpus"], one["--comm-cpus"]) == ("1", "1")


@pytest.mark.parametrize(("args", "named"), [
    (["--bogus"], "--bogus"), (["--nproc"], "--nproc"), (["--nproc", "x"], "--nproc x"),
    (["--sizes", "big"], "--sizes big"),
])  # fmt: skip
def test_a_bad_option_exits_2_naming_it(fast, args, named):
    line = one_error_line(fast(*args, "--dry-run"), 2)
    assert named in line and "--sizes LIST, --quick, --nproc N" in line


def test_a_python_older_than_3_10_is_refused(tmp_path):
    """Every candidate (python3.12 ... python3) is a 3.9 here: one line, before any install."""
    for name in ("python3.12", "python3.11", "python3.10", "python3"):
        fake = tmp_path / name
        fake.write_text(
            '#!/bin/sh\ncase "$2" in *print*) echo "3.9.18 $0"; exit 3;; esac\nexit 1\n'
        )
        fake.chmod(0o755)
    p = run("--dry-run", smi=fake_smi(tmp_path, "12.4", 1),
            env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})  # fmt: skip
    line = one_error_line(p, 1)
    assert "no Python 3.10 or newer" in line and "python3 3.9.18" in line


def test_an_existing_cuda_torch_older_than_2_5_is_refused(tmp_path):
    """$PYTHON's torch (a stand-in here) sees CUDA but is 2.4: one line, nothing installed (the
    fake driver is too old for the table, so a missed probe would stop there, differently)."""
    fake = tmp_path / "fake_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "__version__ = '2.4.1+cu121'\n"
        "class version:\n    cuda = '12.1'\n"
        "class cuda:\n    @staticmethod\n    def is_available():\n        return True\n"
    )
    p = run(smi=fake_smi(tmp_path, "11.8", 1),
            env={"PYTHON": sys.executable, "PYTHONPATH": str(fake.parent)})  # fmt: skip
    line = one_error_line(p, 1)
    assert sys.executable in line and "torch 2.4.1+cu121" in line and ">= 2.5" in line


def test_help_and_shell_checks():
    p = run("--help")
    assert p.returncode == 0 and "--dry-run" in p.stdout and "NEVER RUN ON A GPU" in p.stdout
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    if shutil.which("shellcheck"):
        sc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
        assert sc.returncode == 0, sc.stdout


def result(ranks: int, sizes: dict[str, tuple[int, float, float, float | None]]) -> dict:
    """A scale.py JSON with the keys scale_worker.measure writes that the table reads."""
    rows = []
    for size, (params, tps, overhead, mfu) in sizes.items():
        row = {"size": size, "params": params, "device": "cuda:0", "ranks": ranks,
               "overhead_paired_median": overhead, "overhead_of_medians": overhead,
               "median_step_plain_ms": 1e3 * 32768 * ranks / tps,
               "median_step_atoll_ms": 1e3 * 32768 * ranks / tps * (1 + overhead),
               "tokens_per_s_plain": tps, "tokens_per_s_atoll": tps / (1 + overhead),
               "gpu": H100}  # fmt: skip
        if mfu is not None:
            row |= {"mfu_plain": mfu, "mfu_atoll": mfu / (1 + overhead),
                    "peak_tflops_per_gpu": 989.0}  # fmt: skip
        rows.append(row)
    return {"what": "...", "command": "benchmarks/scale.py", "sizes": rows}


def test_gpu_table_from_scale_json(tmp_path):
    one = result(1, {"300M": (302_000_000, 150_000.0, 0.0125, 0.40),
                     "100M": (101_000_000, 400_000.0, 0.02, None)})  # fmt: skip
    two = result(2, {"100M": (101_000_000, 790_000.0, -0.004, 0.33)})
    text = gpu_table.markdown([one, two])
    lines = text.splitlines()
    assert lines[0] == ("| size | params | ranks | GPU | tokens/s plain | tokens/s atoll | "
                        "MFU plain | MFU atoll | overhead |")  # fmt: skip
    assert lines[1] == "|---|---|---|---|---|---|---|---|---|"
    assert lines[2:] == [  # by parameters, then ranks
        f"| 100M | 101M | 1 | {H100} | 400,000 | 392,157 | - | - | +2.00% |",
        f"| 100M | 101M | 2 | 2 x {H100} | 790,000 | 793,173 | 33.0% | 33.1% | -0.40% |",
        f"| 300M | 302M | 1 | {H100} | 150,000 | 148,148 | 40.0% | 39.5% | +1.25% |",
    ]
    paths = []
    for i, res in enumerate((one, two)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(res))
    out = tmp_path / "md" / "gpu_table.md"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_table.py"), "--out", str(out)]
    p = subprocess.run([*cmd, *map(str, paths)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout == out.read_text() == text
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_table.py"),
                        str(tmp_path / "none.json")], capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 2 and "none.json" in p.stderr
