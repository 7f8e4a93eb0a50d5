"""`fleetcast plan`: choose instance type, precision and region by cost per token
under the SLO for the production traffic mix (method and formulas: docs/plan.md).

Modules: traffic (the traffic profile schema), inputs (results, prices, fixed
costs, latency, availability, quality), curves (load points per candidate),
solver (the method and its explanations), estimate (roofline model for
unmeasured candidates), report (terminal, Markdown, HTML, JSON, plots),
writeback (--write-config), aws (Pricing API and instance offerings), run
(assembles a plan from the command's options).
"""
