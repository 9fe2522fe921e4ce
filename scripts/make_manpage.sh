#!/usr/bin/env bash
# scripts/make_manpage.sh TIERKV VERSION: a manual page (troff, man(7)) made from
# `tierkv --help` and each subcommand's --help, on stdout. Run by the build
# (CMakeLists.txt: tierkv.1) and installed with `cmake --install`.
set -euo pipefail
bin=$1 version=$2
# The help as `tierkv` prints it (argv[0] names the program in its usage lines).
help() { (exec -a tierkv "$bin" "$@" --help); }
esc() { sed -e 's/\\/\\e/g' -e 's/^\./\\\&./' -e "s/^'/\\\\\\&'/"; }
echo ".TH TIERKV 1 \"\" \"tierkv $version\" \"User Commands\""
echo ".SH NAME"
echo "tierkv \\- tiered memory runtime for long-context LLM decoding"
echo ".SH SYNOPSIS"
echo ".B tierkv"
echo "\\fICOMMAND\\fR [\\fIOPTIONS\\fR]"
echo ".SH DESCRIPTION"
echo "Runs GGUF models (llama, qwen2, qwen3, qwen3moe) with their weights and KV cache paged"
echo "across VRAM, host RAM and a disk tier under budgets, sessions that persist across"
echo "restarts, an OpenAI-compatible server, and bench tools. The documents are installed in"
echo "/usr/share/doc/tierkv."
echo ".SH COMMANDS"
echo ".nf"
help | esc
echo ".fi"
for cmd in $(help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF > 0 {print $1}'); do
  echo ".SH \"TIERKV $(echo "$cmd" | tr a-z A-Z)\""
  echo ".nf"
  help "$cmd" | esc
  echo ".fi"
done
