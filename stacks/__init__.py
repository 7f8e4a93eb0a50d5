"""CDK stacks and constructs: one provider stack per region, one consumer stack per consumer.

Entry point: `stacks.app_builder.build_app(cfg, app)`. Each construct owns one
concern (network, model store, notifications, a GPU pool, the endpoint service,
a consumer endpoint) and acknowledges its own cdk-nag findings, with reasons,
next to the resource that raises them.
"""
