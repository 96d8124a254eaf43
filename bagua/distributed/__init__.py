"""Bagua 0.9.2's launchers, ``python -m bagua.distributed.launch`` and
``python -m bagua.distributed.run``: their flags, mapped onto ``bagua-run``
(:mod:`bagua_core.launcher`; elastic jobs through :mod:`bagua.distributed.elastic`)."""
