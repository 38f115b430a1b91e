"""Shell completions for bash, zsh and fish: flags, their choices, files and directories where the metavar
says so, and nothing but files once SCRIPT is on the line (the rest belongs to the script)."""

from __future__ import annotations

from typing import Sequence

from mbr_launch.config.settings import Setting

from .common import (GENERATED, HELP_FLAGS, LAUNCH_ONLY, Subcommand, completes, metavar, offered, subcommands,
                     takes_value, value_flags, visible)


def _bash_case(flags: Sequence[str], action: str) -> str:
    return f"        {'|'.join(flags)}) {action}; return ;;"


def render_bash(settings: Sequence[Setting]) -> str:
    setting_opts = " ".join([*HELP_FLAGS, "--help-all", *(f for s in visible(settings) for f in offered(s))])
    subs = subcommands()
    cases, free = [], []
    for setting in (s for s in visible(settings) if takes_value(s)):
        # Every spelling is recognised (--max_restarts 3 still takes its value); only one is offered.
        if setting.suggestions:
            cases.append(_bash_case(setting.flags, f'COMPREPLY=($(compgen -W "{" ".join(setting.suggestions)}" -- "$cur"))'))
        elif completes(setting):
            flag = "-d" if completes(setting) == "dir" else "-f"
            cases.append(_bash_case(setting.flags, f'compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen {flag} -- "$cur"))'))
        else:
            free += setting.flags
    for option in (o for sub in subs for o in sub.options if o.takes_value):
        if option.completes:
            flag = "-d" if option.completes == "dir" else "-f"
            cases.insert(0, _bash_case(option.flags, f'compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen {flag} -- "$cur"))'))
        else:
            free += option.flags
    # A free-form value (a number, a host): offer nothing rather than flags.
    cases.append(_bash_case(free, "true"))
    sub_cases = []
    for sub in subs:
        opts = ("$setting_opts " if sub.takes_settings else "") + " ".join(sub.flags)
        sub_cases.append(f"            {sub.name}) opts=\"{opts}\"; i=2 ;;")
    return f"""# bash completion for mbr-launch. {GENERATED}
# Use: source this file, or install it as /usr/share/bash-completion/completions/mbr-launch.

_mbr_launch_complete() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local setting_opts="{setting_opts}"
    local opts="$setting_opts {' '.join(LAUNCH_ONLY[1:])}" i=1 word
    COMPREPLY=()
    # '=' is a word break for readline: in --flag=VALUE the flag is two words back.
    if [[ $cur == = ]]; then prev=${{COMP_WORDS[COMP_CWORD-1]}}; cur=""
    elif [[ $prev == = ]]; then prev=${{COMP_WORDS[COMP_CWORD-2]}}
    fi
    if (( COMP_CWORD > 1 )); then
        case ${{COMP_WORDS[1]}} in
{chr(10).join(sub_cases)}
        esac
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
        if (( COMP_CWORD == 1 )); then COMPREPLY+=($(compgen -W "{' '.join(sub.name for sub in subs)}" -- "$cur")); fi
    fi
}}
complete -F _mbr_launch_complete mbr-launch
"""


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _zsh_desc(text: str) -> str:
    # Brackets end the description inside an _arguments spec.
    return text.replace("[", "(").replace("]", ")")


def _zsh_specs(flags: Sequence[str], help: str, meta: str, action: str, shown: Sequence[str] = ()) -> list[str]:
    """One spec per flag; those not in ``shown`` (when given) are understood but not offered ('!')."""
    exclusive = f"({' '.join(flags)})" if len(flags) > 1 else ""
    # A message must not hold a bare colon: it would end the message.
    value = ":" + meta.replace(":", "\\:") + ":" + action if meta else ""
    specs = []
    for flag in flags:
        # --flag= takes its value in the same word after '=' or in the next word.
        equals = "=" if meta and flag.startswith("--") else ""
        hidden = "!" if shown and flag not in shown else ""
        specs.append("    " + _zsh_quote(f"{hidden}{exclusive}{flag}{equals}[{_zsh_desc(help)}]{value}"))
    return specs


def _zsh_action(setting: Setting) -> str:
    if setting.suggestions:
        return "(" + " ".join(setting.suggestions) + ")"
    return {"file": "_files", "dir": "_files -/"}.get(completes(setting), " ")


def _zsh_sub_specs(sub: Subcommand) -> list[str]:
    specs = []
    for option in sub.options:
        specs += _zsh_specs(option.flags, option.help or f"{sub.name}: {option.flags[0].lstrip('-')}",
                            option.metavar or "VALUE" if option.takes_value else "",
                            {"file": "_files", "dir": "_files -/"}.get(option.completes, " "))
    return specs


def render_zsh(settings: Sequence[Setting]) -> str:
    settings_specs = _zsh_specs(("--help-all",), "Show every option and exit", "", "")
    for setting in visible(settings):
        settings_specs += _zsh_specs(setting.flags, setting.help, metavar(setting), _zsh_action(setting),
                                     shown=offered(setting))
    launch = _zsh_specs(HELP_FLAGS, "Show the help and exit", "", "") + _zsh_specs(
        LAUNCH_ONLY[1:], "Print the versions and exit", "", "")
    subs = subcommands()
    listed = " ".join(f'{sub.name}\\:"{sub.summary.lower()}"' for sub in subs)
    cases = []
    for sub in subs:
        array = "_mbr_launch_" + sub.name.replace("-", "_")
        cases += [f"        {sub.name})", f"            local -a {array}", f"            {array}=(",
                  *("    " + spec for spec in _zsh_sub_specs(sub)), "            )",
                  f"            _arguments -s -S : {'$settings_opts ' if sub.takes_settings else ''}${array} "
                  "'*::file:_files'", "            return ;;"]
    return f"""#compdef mbr-launch
# zsh completion for mbr-launch. {GENERATED}
# Use: put this file in a directory of $fpath (before compinit), or source it after compinit.

_mbr-launch_first() {{
    _alternative 'commands:command:(({listed}))' 'files:script:_files'
}}

_mbr-launch() {{
    local -a settings_opts launch_opts
    settings_opts=(
{chr(10).join(settings_specs)}
    )
    launch_opts=(
{chr(10).join(launch)}
    )
    if (( CURRENT > 2 )); then
        local sub=${{words[2]}}
        words=("${{words[1]}}" "${{(@)words[3,-1]}}")
        (( CURRENT-- ))
        case $sub in
{chr(10).join(cases)}
        esac
        words=("${{words[1]}}" "$sub" "${{(@)words[2,-1]}}")
        (( CURRENT++ ))
    fi
    # -A '-*': after SCRIPT, the words belong to the script, not to us.
    _arguments -s -S -A '-*' : $settings_opts $launch_opts '1: :_mbr-launch_first' '*::script arguments:_files'
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
    if setting.suggestions:
        return " -x -a " + _fish_quote(" ".join(setting.suggestions))
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
        "# True once SCRIPT (or a subcommand) is on the line: the words after it are not the launch's.",
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
        "function __mbr_launch_sub",
        "    set -l words (commandline -opc)",
        "    test (count $words) -ge 2; and test $words[2] = $argv[1]",
        "end",
        "",
    ]
    subs = subcommands()
    takes = " ".join(f"__mbr_launch_sub {sub.name}; or" for sub in subs if sub.takes_settings)
    lines.append(f"set -l options '{takes} not __mbr_launch_script_seen'")
    for sub in subs:
        lines.append(f"complete -c mbr-launch -n 'not __mbr_launch_script_seen' -a {sub.name} -d {_fish_quote(sub.summary)}")
    lines += ["complete -c mbr-launch -n 'not __mbr_launch_script_seen' -l version -d 'Print the versions and exit'",
              "complete -c mbr-launch -n 'not __mbr_launch_script_seen' -s h -l help -d 'Show the help and exit'",
              "complete -c mbr-launch -n $options -l help-all -d 'Show every option and exit'"]
    for setting in visible(settings):
        desc = _fish_quote(setting.help)
        for flag in offered(setting):
            lines.append(f"complete -c mbr-launch -n $options {_fish_flag(flag)}{_fish_value(setting)} -d {desc}")
    for sub in subs:
        for option in sub.options:
            for flag in option.flags:
                lines.append(f"complete -c mbr-launch -n '__mbr_launch_sub {sub.name}' {_fish_flag(flag)}"
                             + ((" -r -F" if option.completes else " -x") if option.takes_value else "")
                             + (f" -d {_fish_quote(option.help)}" if option.help else ""))
    return "\n".join(lines) + "\n"
