"""The `mreg` command: parse, call `registry.api`, render. `group` is the one place errors become exit codes.

One module per command family: `cache` (config, pull), `convert`, `plan` (a conversion matrix, and
what job engines run it from), `store` (list, show, history, resolve, verify, gc), `release` (promote,
rollback, mount-check, check), `rollout` (staged release), `remote` (push, sync), `sign`, `serving` (export
triton) and `web` (ui, site build). Options they share are in `options`, output in `render`.
"""

from __future__ import annotations

from registry.cli import cache, convert, plan, release, remote, rollout, serving, sign, store, web
from registry.cli.group import main, run

for _command in (cache.config_cmd, cache.pull_cmd, convert.convert_cmd, plan.plan_cmd, store.list_cmd,
                 store.show_cmd, store.history_cmd, store.resolve_cmd, store.verify_cmd, store.gc_cmd,
                 release.promote_cmd, release.mount_check_cmd, release.rollback_cmd, release.check_cmd,
                 serving.export_group, remote.push_cmd, remote.sync_cmd, sign.sign_cmd, rollout.rollout_group,
                 web.ui_cmd, web.site_group):
    main.add_command(_command)

__all__ = ["main", "run"]
