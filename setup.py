"""Maps the top-level folders into the `vf` import namespace.

`commands/`, `environments/`, `trainer/` and `models/` install as `vf.commands`, `vf.environments`,
`vf.trainer` and `vf.models`, so no generic top-level package lands in site-packages.
Everything else about the package lives in pyproject.toml.
"""

from setuptools import find_packages, setup

ROOTS = {
    "vf": "vf",
    "vf.commands": "commands",
    "vf.environments": "environments",
    "vf.trainer": "trainer",
    "vf.models": "models",
}

packages, package_dir = [], {}
for namespace, folder in ROOTS.items():
    package_dir[namespace] = folder
    packages.append(namespace)
    packages += [f"{namespace}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
