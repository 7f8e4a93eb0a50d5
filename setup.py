"""Packages of the wheel: `fleetcast`, and the repository's other directories under product-named packages.

The names are fleetcast/contract/packaging.py's (read from the source tree: the build has nothing installed).
Everything else about the distribution is in pyproject.toml.
"""

import runpy
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
names = runpy.run_path(str(HERE / "fleetcast" / "contract" / "packaging.py"))
packages = find_packages(include=["fleetcast", "fleetcast.*"])
package_dir = {}
for directory, name in {**names["WHEEL_PACKAGES"], **names["WHEEL_DATA_DIRS"]}.items():
    package_dir[name] = directory
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(directory)]

setup(packages=packages, package_dir=package_dir)
