"""docs/configuration.md's settings tables are the ones generated from the settings models."""

from __future__ import annotations

from blitz.settings import doc as settings_doc
from blitz.settings.bulk import BulkSettings
from blitz.settings.config import (
    AuthSettings,
    BlitzSettings,
    IngressSettings,
    Limits,
    PoolSettings,
    RoutingSettings,
    TracingSettings,
)
from blitz.settings.registry import ModelSpec


def test_reference_settings_tables_are_generated_from_the_fields():
    reference = settings_doc.REFERENCE.read_text(encoding="utf-8")
    assert settings_doc.updated(reference) == reference, (
        f"docs/configuration.md's settings tables differ from blitz/settings/config.py: "
        f"run `{settings_doc.COMMAND}` and commit docs/configuration.md")


def test_every_setting_has_a_description():
    models = (BlitzSettings, RoutingSettings, PoolSettings, IngressSettings, Limits,
              AuthSettings, TracingSettings, BulkSettings, ModelSpec)
    missing = [f"{m.__name__}.{name}" for m in models
               for name, field in m.model_fields.items() if not field.description]
    assert not missing, f"fields without a description (docs/configuration.md shows it): {missing}"
