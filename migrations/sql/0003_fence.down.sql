DROP FUNCTION {schema}.onceflow_lease_lost();
