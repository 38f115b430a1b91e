"""Shell completions for bash, zsh and fish: rendered by the package itself (``mbr_launch.cli.completion``),
which ``mbr-launch --print-completion SHELL`` prints too."""

from mbr_launch.cli.completion import render_bash, render_fish, render_zsh

__all__ = ["render_bash", "render_fish", "render_zsh"]
