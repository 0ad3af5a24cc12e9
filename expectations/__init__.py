"""Great Expectations suites as JSON; shipped inside the package as ``pipeline.expectations_data``."""
