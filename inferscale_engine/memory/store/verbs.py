"""The FactStore's verbs: the decorator (user id checked, call retried).

The not-found answer of a verb asked for facts the user does not have is lookup.raise_missing.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

from inferscale_engine.checks import check_user_id
from inferscale_engine.memory.store.sql.database import retried

_P = ParamSpec("_P")
_R = TypeVar("_R")


def store_verb(call: Callable[_P, _R]) -> Callable[_P, _R]:
    """A store verb: its user_id (when given) checked and normalized first, then retried.

    The one place the store checks user ids: every verb takes the user as `user_id`.
    """
    names = list(inspect.signature(call).parameters)
    position = names.index("user_id") if "user_id" in names else None
    once_more = retried(call)

    @functools.wraps(call)
    def checked(*args: Any, **kwargs: Any) -> _R:
        if kwargs.get("user_id") is not None:
            kwargs["user_id"] = check_user_id(kwargs["user_id"])
        elif position is not None and len(args) > position:
            args = (*args[:position], check_user_id(args[position]), *args[position + 1:])
        return once_more(*args, **kwargs)
    return cast(Callable[_P, _R], checked)

