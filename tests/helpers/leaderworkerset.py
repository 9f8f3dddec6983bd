"""The LeaderWorkerSet fields bisect-npu emits, as the LWS CRD (leaderworkerset.x-k8s.io/v1,
config/crd/bases of kubernetes-sigs/lws) and the core/v1 pod template it embeds define them:
types, enums, required fields, and no field outside them (`extra="forbid"`: a misspelt key fails
here as `kubectl apply` with server-side validation would reject it). Also the expansion the
kubelet applies to a container's command and environment (`$(NAME)`, `$$`)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FieldRef(Strict):
    fieldPath: str
    apiVersion: str | None = None


class EnvSource(Strict):
    fieldRef: FieldRef


class EnvVar(Strict):
    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    valueFrom: EnvSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        assert (self.value is None) != (self.valueFrom is None), f"{self.name}: value or valueFrom, not both"
        return self


class Resources(Strict):
    limits: dict[str, int | str]
    requests: dict[str, int | str]


class VolumeMount(Strict):
    name: str
    mountPath: str
    readOnly: bool = False


class ExecAction(Strict):
    command: list[str] = Field(min_length=1)


class Probe(Strict):
    exec: ExecAction
    periodSeconds: int = Field(ge=1)
    failureThreshold: int = Field(ge=1)


class HostPath(Strict):
    path: str
    type: Literal["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                  "BlockDevice"] | None = None


class EmptyDir(Strict):
    medium: Literal["", "Memory"] = ""
    sizeLimit: str | None = Field(None, pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)?$")


class Volume(Strict):
    name: str = Field(pattern=DNS_LABEL, max_length=63)
    hostPath: HostPath | None = None
    emptyDir: EmptyDir | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        assert (self.hostPath is None) != (self.emptyDir is None), f"volume {self.name}: exactly one source"
        return self


class Container(Strict):
    name: str = Field(pattern=DNS_LABEL, max_length=63)
    image: str = Field(min_length=1)
    command: list[str] = Field(min_length=1)
    env: list[EnvVar] = Field(default_factory=list)
    resources: Resources
    volumeMounts: list[VolumeMount] = Field(default_factory=list)
    readinessProbe: Probe | None = None


class PodSpec(Strict):
    containers: list[Container] = Field(min_length=1)
    volumes: list[Volume] = Field(default_factory=list)

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> PodSpec:
        names = [volume.name for volume in self.volumes]
        assert len(names) == len(set(names)), f"volume names repeat: {names}"
        for container in self.containers:
            for mount in container.volumeMounts:
                assert mount.name in names, f"{container.name} mounts {mount.name}, no volume of the pod"
        return self


class TemplateMetadata(Strict):
    labels: dict[str, str] = Field(default_factory=dict)


class PodTemplateSpec(Strict):
    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: PodSpec


class LeaderWorkerTemplate(Strict):
    leaderTemplate: PodTemplateSpec | None = None
    workerTemplate: PodTemplateSpec
    size: int = Field(1, ge=1)
    restartPolicy: Literal["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"] = \
        "RecreateGroupOnPodRestart"


class LeaderWorkerSetSpec(Strict):
    replicas: int = Field(1, ge=0)
    leaderWorkerTemplate: LeaderWorkerTemplate
    startupPolicy: Literal["LeaderCreated", "LeaderReady"] = "LeaderCreated"


class ObjectMeta(Strict):
    name: str = Field(pattern=DNS_LABEL, max_length=63)
    labels: dict[str, str] = Field(default_factory=dict)


class LeaderWorkerSet(Strict):
    apiVersion: Literal["leaderworkerset.x-k8s.io/v1"]
    kind: Literal["LeaderWorkerSet"]
    metadata: ObjectMeta
    spec: LeaderWorkerSetSpec


_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """`text` as the kubelet passes it to the process: `$(NAME)` of a defined NAME replaced, `$$`
    one `$`, any other reference left as written."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(one, text)
