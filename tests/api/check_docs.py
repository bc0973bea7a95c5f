"""Every kernel name, option, build option, command and link the docs quote exists.

python3 check_docs.py --root SOURCE_DIR --kernels FILE --help-text FILE...

--kernels is what `mha --list-kernels` printed, --help-text what each program's --help printed.
"""
import argparse
import pathlib
import re
import sys

# Options of other programs the docs quote with theirs: pip, CMake, ctest, pytest, GoogleTest,
# libFuzzer's are written -name=value and not matched.
EXTERNAL_OPTIONS = {
    "--config-settings", "--build", "--target", "--install", "--prefix", "--test-dir",
    "--output-on-failure", "--cflags", "--libs", "--gtest_filter", "--gtest_random_seed",
    "--gtest_repeat", "--help",
}
KERNEL = re.compile(r"\bmha_(?:forward|decode|qkv_projection|average_heads|attention)_[a-z0-9_]+")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
BUILD_OPTION = re.compile(r"\bMHA_[A-Z0-9_]+\b")
DEV_COMMAND = re.compile(r"scripts/dev\.sh ([a-z][a-z-]*)")
LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")


def documents(root):
    return [root / "README.md", *sorted((root / "docs").glob("*.md")),
            root / "bench" / "RESULTS.md"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=pathlib.Path, required=True)
    parser.add_argument("--kernels", type=pathlib.Path, required=True)
    parser.add_argument("--help-text", type=pathlib.Path, nargs="+", required=True)
    args = parser.parse_args()
    root = args.root

    kernels = {line.split()[0] for line in args.kernels.read_text().splitlines()
               if line.startswith("mha_")}
    options = set(EXTERNAL_OPTIONS)
    for help_file in args.help_text:
        options.update(OPTION.findall(help_file.read_text()))
    # The benchmarks' Python driver, and the tuner's comparison options (argparse and CLI11).
    for script in (root / "bench").glob("*.py"):
        options.update(re.findall(r"add_argument\(\s*\"(--[a-z0-9_-]+)\"", script.read_text()))
    cmake = "\n".join(p.read_text() for p in [root / "CMakeLists.txt", *root.glob("cmake/*.cmake")])
    sources = "\n".join(p.read_text(errors="replace") for pattern in ("**/*.cpp", "**/*.h", "**/*.py")
                        for p in root.glob(pattern)
                        if not any(part.startswith((".venv", "build")) for part in p.parts))
    dev_sh = (root / "scripts" / "dev.sh").read_text()
    dev_commands = set(re.findall(r"^    ([a-z][a-z-]*)\)", dev_sh, re.M))
    # Environment variables the project reads, and CMake options it declares.
    read_names = set(re.findall(r"getenv\(\"(MHA_[A-Z0-9_]+)\"\)", sources))
    read_names |= set(re.findall(r"(MHA_[A-Z0-9_]+)", dev_sh))
    declared = set(re.findall(r"(?:option|cmake_dependent_option|set)\((MHA_[A-Z0-9_]+)", cmake))

    problems = []
    for doc in documents(root):
        text = doc.read_text()
        where = doc.relative_to(root)
        for name in sorted(set(KERNEL.findall(text))):
            if not name.endswith("_") and name not in kernels:  # not a grammar's stem
                problems.append(f"{where}: kernel {name} is not one the build links")
        for option in sorted(set(OPTION.findall(text))):
            if option not in options:
                problems.append(f"{where}: option {option} is no program's")
        for name in sorted(set(BUILD_OPTION.findall(text))):
            if name not in declared and name not in read_names:
                problems.append(f"{where}: {name} is neither a build option nor read")
        for command in sorted(set(DEV_COMMAND.findall(text))):
            if command not in dev_commands:
                problems.append(f"{where}: scripts/dev.sh has no command {command}")
        for target in sorted(set(LINK.findall(text))):
            if not (doc.parent / target).exists():
                problems.append(f"{where}: link {target} leads nowhere")
        for number, line in enumerate(text.splitlines(), 1):
            if len(line) > 100 and not line.startswith("|") and "](" not in line:
                problems.append(f"{where}:{number}: {len(line)} characters, more than 100")
    for p in problems:
        print(p)
    print(f"{len(documents(root))} documents checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
