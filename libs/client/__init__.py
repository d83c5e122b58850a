"""Typed synchronous Python client of the gpupool HTTP API; the `gpupool` CLI is built on it."""

from libs.client import models
from libs.client.client import GpupoolClient, resolve_connection
from libs.client.errors import ConfigError, GpupoolError, error_from_response
from libs.client.models import *  # noqa: F403 (the response models, listed once: models.__all__)

__all__ = ["ConfigError", "GpupoolClient", "GpupoolError", "error_from_response", "resolve_connection",
           *models.__all__]
