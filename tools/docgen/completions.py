"""Shell completions for bash, zsh and fish: flags, their choices, files and directories where the metavar
says so, and nothing but files once SCRIPT is on the line (the rest belongs to the script)."""

from __future__ import annotations

from typing import Sequence

from mbr_launch.config.settings import Setting

from .common import (GENERATED, HELP_FLAGS, completes, doctor_only_flags, metavar, takes_value, value_flags,
                     visible)


def render_bash(settings: Sequence[Setting]) -> str:
    launch_opts = " ".join([*HELP_FLAGS, *(f for s in visible(settings) for f in s.flags)])
    doctor_opts = " ".join(f for f, _ in doctor_only_flags(settings))
    cases, free = [], [f for f, meta in doctor_only_flags(settings) if meta]
    for setting in (s for s in visible(settings) if takes_value(s)):
        if setting.choices:
            action = f'COMPREPLY=($(compgen -W "{" ".join(setting.choices)}" -- "$cur"))'
        elif completes(setting):
            flag = "-d" if completes(setting) == "dir" else "-f"
            action = f'compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen {flag} -- "$cur"))'
        else:
            free += setting.flags
            continue
        cases.append(f"        {'|'.join(setting.flags)}) {action}; return ;;")
    # A free-form value (a number, a host): offer nothing rather than flags.
    cases.append(f"        {'|'.join(free)}) return ;;")
    return f"""# bash completion for mbr-launch. {GENERATED}
# Use: source this file, or install it as /usr/share/bash-completion/completions/mbr-launch.

_mbr_launch_complete() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local launch_opts="{launch_opts}"
    local doctor_opts="{doctor_opts}"
    local opts=$launch_opts i=1 word
    COMPREPLY=()
    # '=' is a word break for readline: in --flag=VALUE the flag is two words back.
    if [[ $cur == = ]]; then prev=${{COMP_WORDS[COMP_CWORD-1]}}; cur=""
    elif [[ $prev == = ]]; then prev=${{COMP_WORDS[COMP_CWORD-2]}}
    fi
    if [[ ${{COMP_WORDS[1]}} == doctor && $COMP_CWORD -gt 1 ]]; then
        opts="$launch_opts $doctor_opts"; i=2
    fi
    # Once SCRIPT is on the line, the rest belongs to the script: complete files only.
    while (( i < COMP_CWORD )); do
        word=${{COMP_WORDS[i]}}
        case $word in
            {'|'.join(value_flags(settings))}) (( i++ )); [[ ${{COMP_WORDS[i]}} == = ]] && (( i++ )) ;;
            -*) ;;
            *) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
        esac
        (( i++ ))
    done
    case $prev in
{chr(10).join(cases)}
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        compopt -o filenames 2>/dev/null  # only inside real completion
        COMPREPLY=($(compgen -f -- "$cur"))
        if (( COMP_CWORD == 1 )); then COMPREPLY+=($(compgen -W doctor -- "$cur")); fi
    fi
}}
complete -F _mbr_launch_complete mbr-launch
"""


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _zsh_desc(text: str) -> str:
    # Brackets end the description inside an _arguments spec.
    return text.replace("[", "(").replace("]", ")")


def _zsh_specs(flags: Sequence[str], help: str, meta: str, action: str) -> list[str]:
    exclusive = f"({' '.join(flags)})" if len(flags) > 1 else ""
    # A message must not hold a bare colon: it would end the message.
    value = ":" + meta.replace(":", "\\:") + ":" + action if meta else ""
    specs = []
    for flag in flags:
        # --flag= takes its value in the same word after '=' or in the next word.
        equals = "=" if meta and flag.startswith("--") else ""
        specs.append("    " + _zsh_quote(f"{exclusive}{flag}{equals}[{_zsh_desc(help)}]{value}"))
    return specs


def _zsh_action(setting: Setting) -> str:
    if setting.choices:
        return "(" + " ".join(setting.choices) + ")"
    return {"file": "_files", "dir": "_files -/"}.get(completes(setting), " ")


def render_zsh(settings: Sequence[Setting]) -> str:
    launch = _zsh_specs(HELP_FLAGS, "Show the help and exit", "", "")
    for setting in visible(settings):
        launch += _zsh_specs(setting.flags, setting.help, metavar(setting), _zsh_action(setting))
    doctor = []
    for flag, meta in doctor_only_flags(settings):
        doctor += _zsh_specs([flag], f"doctor: {flag.lstrip('-')}", meta, " ")
    return f"""#compdef mbr-launch
# zsh completion for mbr-launch. {GENERATED}
# Use: put this file in a directory of $fpath (before compinit), or source it after compinit.

_mbr-launch_first() {{
    _alternative 'commands:command:((doctor\\:"check the environment"))' 'files:script:_files'
}}

_mbr-launch() {{
    local -a launch_opts doctor_opts
    launch_opts=(
{chr(10).join(launch)}
    )
    doctor_opts=(
{chr(10).join(doctor)}
    )
    if (( CURRENT > 2 )) && [[ ${{words[2]}} == doctor ]]; then
        words=("${{words[1]}}" "${{(@)words[3,-1]}}")
        (( CURRENT-- ))
        _arguments -s -S : $launch_opts $doctor_opts
        return
    fi
    # -A '-*': after SCRIPT, the words belong to the script, not to us.
    _arguments -s -S -A '-*' : $launch_opts '1: :_mbr-launch_first' '*::script arguments:_files'
}}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _mbr-launch "$@"  # autoloaded from $fpath by compinit
else
    compdef _mbr-launch mbr-launch  # sourced
fi
"""


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_flag(flag: str) -> str:
    return f"-s {flag[1:]}" if not flag.startswith("--") else f"-l {flag[2:]}"


def _fish_value(setting: Setting) -> str:
    if not takes_value(setting):
        return ""
    if setting.choices:
        return " -x -a " + _fish_quote(" ".join(setting.choices))
    if completes(setting) == "file":
        return " -r -F"
    if completes(setting) == "dir":
        return " -x -a '(__fish_complete_directories)'"
    return " -x"


def render_fish(settings: Sequence[Setting]) -> str:
    skipped = " ".join(_fish_quote(f) for f in value_flags(settings))
    lines = [
        f"# fish completion for mbr-launch. {GENERATED}",
        "# Use: copy to ~/.config/fish/completions/mbr-launch.fish, or source it.",
        "",
        "# True once SCRIPT (or doctor) is on the line: the words after it are not ours.",
        "function __mbr_launch_script_seen",
        "    set -l words (commandline -opc)",
        "    set -e words[1]",
        "    set -l skip 0",
        "    for word in $words",
        "        if test $skip = 1",
        "            set skip 0",
        "            continue",
        "        end",
        "        switch $word",
        f"            case {skipped}",
        "                set skip 1",
        "            case '-*'",
        "            case '*'",
        "                return 0",
        "        end",
        "    end",
        "    return 1",
        "end",
        "",
        "function __mbr_launch_doctor",
        "    set -l words (commandline -opc)",
        "    test (count $words) -ge 2; and test $words[2] = doctor",
        "end",
        "",
        "set -l options '__mbr_launch_doctor; or not __mbr_launch_script_seen'",
        "complete -c mbr-launch -n 'not __mbr_launch_script_seen' -a doctor -d 'Check the environment'",
        "complete -c mbr-launch -n __mbr_launch_doctor -f",
        "complete -c mbr-launch -n $options -s h -l help -d 'Show the help and exit'",
    ]
    for setting in visible(settings):
        desc = _fish_quote(setting.help)
        for flag in setting.flags:
            lines.append(f"complete -c mbr-launch -n $options {_fish_flag(flag)}{_fish_value(setting)} -d {desc}")
    for flag, meta in doctor_only_flags(settings):
        lines.append(f"complete -c mbr-launch -n __mbr_launch_doctor {_fish_flag(flag)}"
                     + (" -x" if meta else ""))
    return "\n".join(lines) + "\n"
