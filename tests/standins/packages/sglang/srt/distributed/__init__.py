"""STAND-IN package (rankscope tests): not the real framework."""
