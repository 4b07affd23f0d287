"""The ``fastpath`` command: ``serve``, ``build``, ``swap``/``rollback``/``status`` and ``bench`` (``fastpath.cli.main.main``)."""
