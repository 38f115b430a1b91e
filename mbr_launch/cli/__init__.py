"""The thin Typer layer over ``mbr_launch.api``: options generated from the settings table, one error -> one exit code."""
