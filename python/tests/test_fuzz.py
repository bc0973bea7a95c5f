"""The Python entry points under the atheris fuzzer (fuzz_python_api.py), for a bounded time."""
import pathlib
import subprocess
import sys

HARNESS = pathlib.Path(__file__).with_name("fuzz_python_api.py")


def test_python_api_survives_fuzzing(tmp_path):
    run = subprocess.run([sys.executable, str(HARNESS), "-max_total_time=30",
                          "-print_final_stats=1", f"-artifact_prefix={tmp_path}/"],
                         cwd=HARNESS.parent, capture_output=True, text=True, timeout=300)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-4000:]
    assert "Done" in report
