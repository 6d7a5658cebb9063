"""Questions no LoCoMo conversation holds evidence for: what the relevance floor is measured on.

The dev conversations are two friends talking about their lives (family, hobbies, work, travel, pets);
these ask about a software team's operations, which none of them mentions. A recall of one should come
back with few or no items (evals/relevance_floor.py counts them). Written for this eval, not from a data set.
"""

QUESTIONS: tuple[str, ...] = (
    "When does the staging db password rotate?",
    "What is the CPU quota of the Kubernetes namespace for the payments service?",
    "Which TLS certificate expires next on the load balancer?",
    "What is the retention period of the Postgres WAL archive?",
    "Who is on call for the billing API this week?",
    "What is the rate limit of the public GraphQL endpoint?",
    "Which Terraform module provisions the Redis cluster?",
    "What was the root cause of the last S3 outage in eu-west-1?",
    "How many replicas does the ingress controller deployment run?",
    "Which Python version does the CI pipeline pin for the backend tests?",
    "What is the SLO for p99 latency of the checkout service?",
    "Where is the Grafana dashboard for Kafka consumer lag?",
    "Which feature flag gates the new invoice export?",
    "What is the default JVM heap size of the search indexer?",
    "When is the next maintenance window for the Elasticsearch cluster?",
    "Which IAM role can write to the backups bucket?",
    "What is the max connection pool size of the orders database?",
    "How long do Docker images stay in the container registry before cleanup?",
    "Which cron job rebuilds the sitemap every night?",
    "What port does the internal metrics exporter listen on?",
    "Which version of OpenSSL is in the base container image?",
    "How is the VPN split tunnel configured for contractors?",
    "What is the disk usage alert threshold on the log servers?",
    "Which DNS provider hosts the api subdomain?",
    "What is the Helm chart version of the Prometheus operator?",
    "How many API keys does the staging environment have?",
    "What is the batch size of the nightly ETL job into the warehouse?",
    "Which webhook notifies Slack when a deploy fails?",
    "What is the garbage collection setting of the Go microservices?",
    "Which branch protection rules apply to the infrastructure repository?",
)
