"""Inventory service settings (env prefix GPUPOOL_INVENTORY_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings
from services.inventory.domain import HealthRules, OrphanRules


class InventorySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_INVENTORY_", extra="ignore")

    node_lost_after_s: float = Field(
        default=15.0, gt=0,
        description="A ready node that has not reported for this long is declared lost (an agent sampling by change "
                    "sends at least every HEARTBEAT_S: keep this at least twice that); also how fresh a sample must "
                    "be to count a GPU as in use")
    node_sweep_interval_s: float = Field(default=1.0, gt=0, description="Seconds between node-lost sweeps")

    # the GPU health state machine (services/inventory/domain.py)
    sbe_burst: int = Field(default=10, ge=1, description="New correctable ECC errors between two samples that "
                                                         "count as a burst (a warning)")
    suspect_strikes: int = Field(default=3, ge=1, description="Warnings that quarantine a suspect GPU")
    strike_gap_s: float = Field(default=10.0, ge=0, description="Warnings closer together are one strike")
    suspect_clear_s: float = Field(default=300.0, ge=0, description="A suspect GPU quiet this long is healthy")
    recheck_after_s: float = Field(default=900.0, ge=0, description="A quarantined GPU whose samples are clean this "
                                                                     "long enters probation; 0: only an operator "
                                                                     "clears it")
    probation_s: float = Field(default=600.0, ge=0, description="Probation must stay clean this long")

    # rollups and orphans (a background loop every maintenance_interval_s)
    maintenance_interval_s: float = Field(default=5.0, gt=0, description="Seconds between rollup/orphan passes")
    rollup_late_s: float = Field(default=10.0, ge=0, description="A minute is closed (its TelemetryRolledUp "
                                                                 "emitted) this long after it ends, so late samples "
                                                                 "still count")
    rollup_retention_s: float = Field(default=7 * 24 * 3600.0, gt=0, description="How long rollups are kept")
    orphan_process_after_s: float = Field(default=60.0, ge=0, description="Processes on a GPU no allocation holds, "
                                                                           "for this long, are reported")
    orphan_no_process_after_s: float = Field(default=1800.0, ge=0, description="An allocation whose GPUs showed "
                                                                                "no process this long is reported")

    def health_rules(self) -> HealthRules:
        return HealthRules(sbe_burst=self.sbe_burst, suspect_strikes=self.suspect_strikes,
                           strike_gap_s=self.strike_gap_s, suspect_clear_s=self.suspect_clear_s,
                           recheck_after_s=self.recheck_after_s or None, probation_s=self.probation_s)

    def orphan_rules(self) -> OrphanRules:
        return OrphanRules(process_after_s=self.orphan_process_after_s,
                           no_process_after_s=self.orphan_no_process_after_s)
