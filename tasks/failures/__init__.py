"""Why a server failed and what to do: the failure-rule table, log scanning, explanations."""
