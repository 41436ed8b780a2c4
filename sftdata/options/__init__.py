"""The options of the build commands as data. ``option``: what an option declares, and the
options the build commands share with pack (light: no pipeline imported); ``declared``:
every option of prepare-chat, prepare-tool, prepare-pref and prepare-rl, declared once;
``values`` and ``config``: an option's value from text or a ``--config`` file. Below the
pipelines that take them, above ``store``; no typer (the CLI derives its parameters here)."""
