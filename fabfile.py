"""llmfab: `fab --list` shows the tasks; `fab --help TASK` documents each flag."""
from tasks import ns  # noqa: F401  (Fabric loads the module-level `ns` as the collection)
