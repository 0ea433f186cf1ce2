"""The API's one error type: raised by a route (or a view helper) and answered by the app's handler
(:mod:`node.api.app`) as JSON ``{"code", "message"}`` with its status, or as the explorer's error page on HTML
routes."""

from __future__ import annotations


class ApiError(Exception):
    """An error answered as JSON ``{"code", "message"}`` (or an HTML page on explorer routes) with ``status``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


__all__ = ["ApiError"]
