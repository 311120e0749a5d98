"""``kclasync multilang``: a drop-in for the Java KCL's MultiLangDaemon. The same properties file
and the same record-processor programs (amazon-kclpy, the aws-kcl npm package, ...), one child
process per held shard speaking the MultiLang protocol on stdin/stdout, on kclasync's runtime.

Modules: ``properties`` (the file and its values), ``settings`` (to kclasync's configuration),
``protocol`` (the messages, pure), ``child`` (one child process), ``adapter`` (kclasync's
processor contract spoken to a child), ``daemon`` (the worker and how it stops).
"""

from __future__ import annotations

from kclasync.multilang.daemon import MultiLangDaemon, run_multilang
from kclasync.multilang.properties import PropertiesError
from kclasync.multilang.settings import MultiLangSettings, load_settings

__all__ = [
    "MultiLangDaemon",
    "MultiLangSettings",
    "PropertiesError",
    "load_settings",
    "run_multilang",
]
