"""Alembic environment: the URL comes from ULAB_DATABASE_URL (see backend.core.settings)."""
from alembic import context
from sqlalchemy import engine_from_config, pool

from backend.auth import models as _auth  # noqa: F401
from backend.calibration import models as _calibration  # noqa: F401
from backend.core.db import Base
from backend.execution import attempt_tokens as _attempt_tokens  # noqa: F401
from backend.metrics import models as _metrics  # noqa: F401  (register tables on Base.metadata)
from backend.plans import models as _plans  # noqa: F401
from backend.runs import attempts as _attempts  # noqa: F401
from backend.runs import models as _runs  # noqa: F401
from backend.runs import nodes as _nodes  # noqa: F401
from backend.runs import share as _share  # noqa: F401
from backend.workers import models as _workers  # noqa: F401

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                     poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
