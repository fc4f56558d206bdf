"""The manifests in docs/guides/kubernetes.md against the operators' published API schemas (issue
47, acceptance 3), with a JSON-schema validator (jsonschema), strictly: an unknown field fails,
as `kubectl apply --validate=strict` fails it. The schemas come from the operators' own Python
SDKs on PyPI, generated from each operator's OpenAPI specification, pinned in scripts/setup.sh
and installed in an environment of their own (DLRUN_SCHEMA_PYTHON):
- kubeflow-trainer-api (kubeflow/trainer's API: TrainJob, TrainingRuntime): its pydantic models'
  JSON schema;
- kubeflow-training (training-operator v1's API: PyTorchJob, with Kubernetes' own models from
  the kubernetes client): its models' OpenAPI types, turned into a JSON schema here.
Each YAML block of the page is checked against its kind's schema, and a block with a misspelt
field is refused, so the check can fail. Runs under DLRUN_SCHEMA_PYTHON (the file re-executes
itself there)."""

import os
import re
import sys
import unittest

PAGE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "guides", "kubernetes.md"
)
OPENAPI_SCALARS = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "bool": {"type": "boolean"},
    "float": {"type": "number"},
    "datetime": {"type": "string"},
    "date": {"type": "string"},
    "object": {},
    "Quantity": {"type": ["string", "integer", "number"]},
}


def strict(schema):
    """Every object schema with properties refuses other fields (in place; returns it)."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


def trainer_schemas():
    """{kind: JSON schema} of Trainer v2's resources, from kubeflow-trainer-api."""
    import kubeflow_trainer_api.models as models

    return {
        kind: strict(getattr(models, f"TrainerV1alpha1{kind}").model_json_schema())
        for kind in ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")
    }


def openapi_schema(root):
    """A JSON schema of the OpenAPI-generated model class `root` (openapi_types, attribute_map),
    its models found in kubeflow.training.models and kubernetes.client.models."""
    import kubeflow.training.models as training
    import kubernetes.client.models as k8s

    defs = {}

    def type_schema(name):
        if name in OPENAPI_SCALARS:
            return OPENAPI_SCALARS[name]
        listed = re.fullmatch(r"list\[(.+)\]", name)
        if listed:
            return {"type": "array", "items": type_schema(listed.group(1))}
        mapped = re.fullmatch(r"dict\(str, (.+)\)", name)
        if mapped:
            return {"type": "object", "additionalProperties": type_schema(mapped.group(1))}
        # Kubernetes' own types are the client's (K8sIoApiAutoscalingV2MetricSpec: V2MetricSpec).
        own = re.search(r"V\d+(?:alpha\d+|beta\d+)?[A-Z]\w*$", name)
        return model_ref(
            getattr(training, name, None) or getattr(k8s, name, None) or getattr(k8s, own.group(0))
        )

    def model_ref(cls):
        if cls.__name__ not in defs:
            defs[cls.__name__] = {}  # a placeholder while its fields are made (recursive types)
            properties = {
                cls.attribute_map[field]: type_schema(kind)
                for field, kind in cls.openapi_types.items()
            }
            defs[cls.__name__] = {
                "type": "object",
                "properties": properties,
                "additionalProperties": False,
            }
        return {"$ref": f"#/$defs/{cls.__name__}"}

    schema = model_ref(root)
    schema["$defs"] = defs
    return schema


def schemas():
    from kubeflow.training.models import KubeflowOrgV1PyTorchJob

    found = trainer_schemas()
    found["PyTorchJob"] = openapi_schema(KubeflowOrgV1PyTorchJob)
    return found


def manifests():
    """Every YAML document in the page's ```yaml blocks."""
    import yaml

    with open(PAGE) as f:
        blocks = re.findall(r"```yaml\n(.*?)```", f.read(), re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


class KubernetesManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.schemas = schemas()

    def errors(self, manifest):
        import jsonschema

        validator = jsonschema.Draft202012Validator(self.schemas[manifest["kind"]])
        return [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(manifest)
        ]

    def test_every_manifest_of_the_page_fits_its_operators_schema(self):
        found = manifests()
        self.assertEqual(
            sorted(m["kind"] for m in found),
            ["PyTorchJob", "PyTorchJob", "TrainJob", "TrainingRuntime"],
        )
        for manifest in found:
            with self.subTest(kind=manifest["kind"], name=manifest["metadata"]["name"]):
                self.assertEqual(self.errors(manifest), [])
                if manifest["kind"] != "TrainJob":  # its runtime's command is the one
                    self.assertRegex(str(manifest), r"'command': \['dlrun'")

    def test_a_misspelt_field_is_refused(self):
        for manifest in manifests():
            with self.subTest(kind=manifest["kind"]):
                manifest["spec"]["numberOfNodes"] = 3
                self.assertTrue(any("numberOfNodes" in e for e in self.errors(manifest)))


if __name__ == "__main__":
    python = os.environ.get("DLRUN_SCHEMA_PYTHON")
    # A venv's python links to the system's: its environment is told by its prefix.
    if python and sys.prefix != os.path.dirname(os.path.dirname(os.path.abspath(python))):
        os.execv(python, [python, *sys.argv])
    unittest.main()
