"""The `mreg` command: parse, call `registry.api`, render. `group` is the one place errors become exit codes.

One module per command family: `cache` (config, pull), `convert`, `store` (list, show,
history, resolve, verify, gc), `release` (promote, rollback, mount-check, check), `rollout` (staged release),
`remote`
(push, sync), `sign` and `serving` (export triton). Options they share are in `options`, output in `render`.
"""

from __future__ import annotations

from registry.cli import cache, convert, release, remote, rollout, serving, sign, store
from registry.cli.group import main, run

for _command in (cache.config_cmd, cache.pull_cmd, convert.convert_cmd, store.list_cmd, store.show_cmd,
                 store.history_cmd, store.resolve_cmd, store.verify_cmd, store.gc_cmd, release.promote_cmd,
                 release.mount_check_cmd, release.rollback_cmd, release.check_cmd, serving.export_group,
                 remote.push_cmd, remote.sync_cmd, sign.sign_cmd, rollout.rollout_group):
    main.add_command(_command)

__all__ = ["main", "run"]
