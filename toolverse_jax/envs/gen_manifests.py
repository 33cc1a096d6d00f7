"""Writes the synthesized-server corpus (manifests/synth/*.json) from compact entity templates.

    python -m toolverse_jax.envs.gen_manifests

Each service lists entities as "entity(OPS): field, field..., +action". OPS letters: C create,
G get, L list, S search, U update, D delete (default CGLSUD). Field suffixes: @ email, # date,
$ amount (number), % integer, ? boolean, [] list of strings, =a|b enum; a leading ! marks a
natural key (get by that field instead of an id). The first two fields are required on create.
Also writes a simulated twin (`<name>_sim`) of every harvested third-party manifest.
"""

import glob
import json
import os

from toolverse_jax.envs.catalog import MANIFEST_DIR

SERVICES = {
    # issue trackers / project management
    "github_issues": ["issue: title, body, state=open|closed, assignee@, labels[]; +close, +reopen",
                      "pull_request(CGLU): title, head_branch, base_branch, author@, state=open|merged|closed; +merge"],
    "gitlab": ["merge_request: title, source_branch, target_branch, author@, state=opened|merged; +approve, +merge",
               "pipeline(GLC): ref, status=pending|running|success|failed, duration%; +cancel, +retry"],
    "jira": ["issue: summary, description, status=todo|in_progress|done, assignee@, priority=low|medium|high, due_date#; +transition, +assign",
             "sprint(CGLU): name, start_date#, end_date#, goal; +start, +complete"],
    "linear": ["issue: title, description, team, priority%, estimate%, assignee@; +archive",
               "cycle(CGL): name, starts_at#, ends_at#"],
    "asana": ["task: name, notes, assignee@, due_on#, completed?; +complete", "project(CGLU): name, owner@, color"],
    "trello": ["card: name, desc, list_name, due#, labels[]; +archive", "board(CGL): name, description, visibility=private|team|public"],
    "clickup": ["task: name, description, status=to_do|in_progress|complete, assignee@, due_date#, time_estimate%"],
    "monday": ["item: name, board, status=working|stuck|done, owner@, deadline#", "update(CL): item_id, body"],
    "youtrack": ["issue: summary, description, project, state=submitted|open|fixed, reporter@; +resolve"],
    "shortcut": ["story: name, description, story_type=feature|bug|chore, estimate%, owner@; +complete"],
    "todoist": ["task: content, description, due_date#, priority%, project; +close, +reopen", "project(CGLD): name, color"],
    "basecamp": ["todo: content, description, assignee@, due_on#; +complete", "message(CGL): subject, content, author@"],
    # CRM / sales
    "salesforce": ["account: name, industry, annual_revenue$, owner@, city", "opportunity: name, account_id, amount$, stage=prospecting|negotiation|closed_won|closed_lost, close_date#; +close",
                   "lead(CGLSU): first_name, last_name, email@, company, status=new|working|qualified; +convert"],
    "hubspot": ["contact: email@, firstname, lastname, phone, company, lifecycle_stage=lead|customer", "deal: dealname, amount$, dealstage=appointment|contract|closedwon, closedate#, contact_id"],
    "pipedrive": ["deal: title, value$, currency=USD|EUR|GBP, person_id, stage=lead|proposal|won|lost; +win, +lose", "person(CGLS): name, email@, phone"],
    "zoho_crm": ["lead: last_name, company, email@, lead_source=web|referral|event, rating%; +convert", "call(CGL): subject, call_start_time#, duration%"],
    "close_crm": ["lead: name, url, status=potential|bad_fit|customer, contact_email@", "activity(CL): lead_id, note, type=call|email|meeting"],
    "copper": ["company: name, email_domain, city, employees%", "opportunity(CGLU): name, company_id, monetary_value$, close_date#"],
    # calendars / scheduling
    "google_calendar": ["event: summary, start#, end#, location, attendees[], description; +cancel", "calendar(GL): summary, time_zone"],
    "outlook_calendar": ["meeting: subject, start#, end#, location, organizer@, attendees[]; +accept, +decline"],
    "calendly": ["scheduled_event(GLS): name, start_time#, invitee_email@, status=active|canceled; +cancel", "event_type(GL): name, duration%, slug"],
    "cal_com": ["booking: title, start_time#, end_time#, attendee_email@, status=accepted|pending|cancelled; +cancel, +reschedule"],
    "acuity_scheduling": ["appointment: first_name, last_name, email@, datetime#, appointment_type; +cancel"],
    # storage / files
    "google_drive": ["file: name, mime_type, parent_folder, size%, owner@, shared?; +share, +trash", "folder(CGL): name, parent_folder"],
    "dropbox": ["file: path, name, size%, rev; +share", "shared_link(CGLD): path, url, visibility=public|team"],
    "box": ["file: name, folder_id, size%, owned_by@; +lock, +unlock", "collaboration(CGLD): item_id, accessible_by@, role=editor|viewer"],
    "onedrive": ["drive_item: name, parent_path, size%, web_url; +share"],
    "aws_s3": ["bucket(CGLD): name, region=us-east-1|eu-west-1|ap-south-1, versioning?", "object: bucket, key, size%, content_type, etag"],
    "google_cloud_storage": ["blob: bucket, name, size%, content_type, storage_class=standard|nearline|coldline"],
    # maps / places / weather
    "google_maps": ["place(GLS): !query, name, address, rating$, lat$, lng$", "directions(G): !origin, !destination, distance_km$, duration_min%, mode=driving|walking|transit"],
    "mapbox": ["geocode(G): !address, lat$, lng$, place_name", "isochrone(G): !location, minutes%, area_km2$"],
    "openstreetmap": ["poi(GLS): !name, amenity, lat$, lon$, city"],
    "openweather": ["current_weather(G): !city, temperature$, humidity%, conditions=clear|clouds|rain|snow, wind_speed$",
                    "forecast(G): !city, days%, high$, low$, conditions=clear|clouds|rain|snow"],
    "weatherapi": ["weather(G): !location, temp_c$, feelslike_c$, condition=sunny|cloudy|rain, uv%", "alert(LG): !region, headline, severity=minor|moderate|severe"],
    "noaa": ["observation(G): !station, temperature$, pressure$, observed_at#", "tide(G): !station, height_m$, time#"],
    # finance
    "stripe": ["customer: email@, name, phone, balance$", "payment_intent: amount$, currency=usd|eur|gbp, customer_id, status=requires_payment|succeeded|canceled; +confirm, +cancel",
               "refund(CGL): payment_intent_id, amount$, reason=duplicate|fraudulent|requested_by_customer"],
    "plaid": ["account(GL): name, official_name, balance$, type=depository|credit|loan", "transaction(GLS): account_id, amount$, merchant_name, date#, category"],
    "alpaca_trading": ["order: symbol, qty%, side=buy|sell, type=market|limit, limit_price$, status=new|filled|canceled; +cancel", "position(GL): symbol, qty%, market_value$"],
    "coinbase": ["wallet(GL): currency=BTC|ETH|USDC, balance$, name", "trade(CGL): product_id, side=buy|sell, size$, price$"],
    "quickbooks": ["invoice: customer_name, amount$, due_date#, status=draft|sent|paid, email@; +send, +void", "bill(CGLU): vendor, amount$, due_date#"],
    "xero": ["invoice: contact_name, total$, due_date#, status=draft|authorised|paid; +approve", "payment(CGL): invoice_id, amount$, date#"],
    "yahoo_finance": ["quote(G): !symbol, price$, change_percent$, volume%, market_cap$", "news(LS): !symbol, title, publisher, published_at#"],
    "alpha_vantage": ["time_series(G): !symbol, interval=daily|weekly|monthly, close$, high$, low$", "fx_rate(G): !from_currency, !to_currency, rate$"],
    "wise": ["transfer: target_account, amount$, currency=USD|EUR|GBP, reference, status=pending|sent|completed; +cancel", "quote(CG): source_currency, target_currency, rate$, fee$"],
    "paypal": ["payment: amount$, currency=USD|EUR, payee_email@, note, status=created|approved|completed; +capture, +refund"],
    "expensify": ["expense: merchant, amount$, date#, category, report_id", "report(CGLU): title, policy, total$; +submit, +approve"],
    # communication
    "slack": ["message: channel, text, user@, thread_ts; +pin", "channel(CGLS): name, topic, is_private?; +archive"],
    "discord": ["message: channel_id, content, author; +pin", "channel(CGL): name, topic, guild_id"],
    "twilio": ["sms: to, body, from_number, status=queued|sent|delivered", "call(CGL): to, from_number, duration%, status=queued|completed"],
    "sendgrid": ["email: to@, subject, content, from_email@; +schedule", "template(CGLU): name, subject, html_content"],
    "mailchimp": ["campaign: subject_line, list_id, from_name, status=save|sent|schedule; +send", "member(CGLSU): email_address@, list_id, status=subscribed|unsubscribed"],
    "telegram": ["message: chat_id, text, parse_mode=markdown|html; +pin", "chat(GL): title, type=private|group|channel"],
    "zoom": ["meeting: topic, start_time#, duration%, host_email@, agenda; +end", "recording(GLD): meeting_id, file_type, size%"],
    "microsoft_teams": ["channel_message: team_id, channel, content; +reply", "team(CGL): display_name, description"],
    "whatsapp_business": ["message: to, text, type=text|template, status=sent|delivered|read"],
    # docs / knowledge
    "notion": ["page: title, parent_id, content, icon; +archive", "database(CGL): title, parent_id"],
    "confluence": ["page: title, space_key, body, version%; +publish", "space(CGL): key, name, description"],
    "google_docs": ["document: title, body, owner@; +share"],
    "airtable": ["record: base_id, table_name, fields_json, created_time#", "base(GL): name, permission_level=read|edit|owner"],
    "coda": ["doc: title, folder_id, owner@", "row(CGLUD): doc_id, table, values_json"],
    "obsidian": ["note: path, content, tags[]; +move", "link(GL): source_path, target_path"],
    "evernote": ["note: title, content, notebook, tags[]", "notebook(CGL): name, stack"],
    # devops / monitoring
    "pagerduty": ["incident: title, service_id, urgency=high|low, status=triggered|acknowledged|resolved, assignee@; +acknowledge, +resolve", "service(GL): name, escalation_policy"],
    "datadog": ["monitor: name, query, type=metric|log|apm, threshold$; +mute, +unmute", "dashboard(CGLD): title, description"],
    "sentry": ["issue(GLSU): title, project, level=error|warning|info, count%, status=unresolved|resolved; +resolve, +ignore", "release(CGL): version, project"],
    "circleci": ["pipeline(CGL): project_slug, branch, state=created|running|success|failed; +rerun", "workflow(GL): pipeline_id, name, status=running|success|failed; +cancel"],
    "vercel": ["deployment: name, url, target=production|preview, state=building|ready|error; +promote, +cancel", "domain(CGLD): name, verified?"],
    "cloudflare": ["dns_record: zone_id, name, type=A|AAAA|CNAME|TXT, content, ttl%", "zone(GL): name, status=active|pending"],
    "kubernetes": ["deployment: name, namespace, replicas%, image; +scale, +restart", "pod(GLD): name, namespace, status=running|pending|failed, node"],
    "docker_hub": ["repository: name, namespace, description, is_private?", "tag(GLD): repository, name, digest, size%"],
    "grafana": ["dashboard: title, folder, uid; +star", "alert_rule(CGLU): title, condition, severity=critical|warning; +pause"],
    "terraform_cloud": ["workspace: name, organization, terraform_version, auto_apply?", "run(CGL): workspace_id, message, status=pending|planned|applied; +apply, +discard"],
    # commerce
    "shopify": ["product: title, vendor, product_type, price$, inventory_quantity%", "order(GLSU): email@, total_price$, financial_status=pending|paid|refunded, fulfillment_status=unfulfilled|fulfilled; +fulfill, +cancel"],
    "woocommerce": ["product: name, regular_price$, sku, stock_quantity%", "order(CGLU): customer_email@, total$, status=pending|processing|completed; +complete"],
    "amazon_seller": ["listing: sku, title, price$, quantity%, condition=new|used", "shipment(CGL): destination, units%, status=working|shipped|received"],
    "ebay": ["listing: title, start_price$, category, quantity%, condition=new|used; +end", "offer(GL): listing_id, amount$, buyer, status=pending|accepted|declined; +accept"],
    "square": ["payment: amount$, currency=USD|CAD, source_id, status=approved|completed; +complete, +cancel", "catalog_item(CGLS): name, price$, category"],
    "etsy": ["listing: title, description, price$, quantity%, tags[]; +renew", "receipt(GL): buyer_email@, grandtotal$, was_shipped?"],
    # travel / mobility / food
    "airbnb": ["listing(GLS): name, city, price_per_night$, rating$, bedrooms%", "reservation: listing_id, guest_name, check_in#, check_out#, total$; +cancel"],
    "booking_com": ["hotel(GLS): name, city, stars%, price$", "reservation: hotel_id, guest_email@, checkin#, nights%, status=confirmed|cancelled; +cancel"],
    "expedia": ["flight_offer(GLS): origin, destination, departure_date#, price$, airline", "itinerary: flight_offer_id, traveler_name, traveler_email@, status=booked|cancelled; +cancel"],
    "uber": ["ride: pickup, dropoff, product=uberx|comfort|black, fare_estimate$, status=requested|accepted|completed; +cancel", "receipt(GL): ride_id, total$, distance_km$"],
    "lyft": ["ride: origin, destination, ride_type=standard|xl|lux, cost$, status=pending|accepted|dropped_off; +cancel"],
    "doordash": ["delivery: pickup_address, dropoff_address, order_value$, tip$, status=created|picked_up|delivered; +cancel", "store(GLS): name, cuisine, rating$"],
    "opentable": ["reservation: restaurant_id, party_size%, date#, time, name, email@; +cancel", "restaurant(GLS): name, cuisine, city, price_range%"],
    "yelp": ["business(GLS): name, city, rating$, review_count%, categories[]", "review(GL): business_id, rating%, text, author"],
    # HR / recruiting / support
    "bamboohr": ["employee: first_name, last_name, work_email@, department, hire_date#, job_title", "time_off_request: employee_id, start#, end#, type=vacation|sick; +approve, +deny"],
    "workday": ["worker(GLSU): name, email@, position, manager, location", "job_requisition: title, department, headcount%; +close"],
    "greenhouse": ["candidate: first_name, last_name, email@, phone", "application: candidate_id, job_id, stage=applied|interview|offer|hired; +advance, +reject"],
    "lever": ["opportunity: name, email@, stage=new|screen|onsite|offer, owner@; +archive"],
    "zendesk": ["ticket: subject, description, requester_email@, priority=low|normal|high|urgent, status=new|open|solved; +solve", "user(CGLS): name, email@, role=end-user|agent"],
    "intercom": ["conversation: subject, body, contact_email@, state=open|closed|snoozed; +close, +snooze", "contact(CGLSU): email@, name, role=user|lead"],
    "freshdesk": ["ticket: subject, description, email@, priority%, status%; +close", "agent(GL): name, email@, available?"],
    # analytics / marketing / social
    "google_analytics": ["report(G): !property_id, start_date#, end_date#, sessions%, users%, bounce_rate$", "property(GL): name, time_zone"],
    "google_ads": ["campaign: name, budget$, status=enabled|paused, start_date#; +pause, +enable", "ad_group(CGLU): campaign_id, name, cpc_bid$"],
    "hootsuite": ["post: text, social_profile, scheduled_time#, state=scheduled|sent; +approve"],
    "twitter": ["tweet: text, reply_to_id, author; +like, +retweet", "user(GS): !username, name, followers%"],
    "linkedin": ["post: text, visibility=public|connections, author; +like", "connection(GLS): name, headline, email@"],
    "reddit": ["post: subreddit, title, text, score%; +upvote", "comment(CGL): post_id, body, author"],
    # media / learning / health / home
    "spotify": ["playlist: name, description, public?, owner; +follow", "track(GLS): name, artist, album, duration_ms%"],
    "youtube": ["video(GLSU): title, description, channel, view_count%, privacy=public|unlisted|private", "comment(CGL): video_id, text, author"],
    "canvas_lms": ["assignment: name, course_id, due_at#, points_possible%; +publish", "submission(CGL): assignment_id, user_email@, score$, workflow_state=submitted|graded; +grade"],
    "coursera": ["course(GLS): name, partner, workload, rating$", "enrollment: course_id, learner_email@, progress%; +complete"],
    "fitbit": ["activity: activity_name, date#, duration_min%, calories%, distance_km$", "sleep_log(GL): date#, minutes_asleep%, efficiency%"],
    "myfitnesspal": ["food_entry: food_name, meal=breakfast|lunch|dinner|snack, calories%, date#", "goal(GU): calories%, protein_g%"],
    "home_assistant": ["device(GLSU): name, area, state=on|off, device_class; +turn_on, +turn_off", "automation: name, trigger, action; +enable, +disable"],
    "philips_hue": ["light(GLU): name, on?, brightness%, color; +toggle", "scene(CGL): name, group; +activate"],
    "strava": ["activity: name, sport_type=run|ride|swim, distance_km$, moving_time%, start_date#", "segment(GLS): name, distance_km$, city"],
    "goodreads": ["book(GLS): title, author, isbn, rating$", "shelf_entry: book_id, shelf=read|to-read|currently-reading, rating%"],
    "eventbrite": ["event: name, start#, venue, capacity%, status=draft|live|ended; +publish, +cancel", "attendee(GL): event_id, email@, checked_in?; +check_in"],
    "ticketmaster": ["event(GLS): name, venue, city, date#, min_price$", "order: event_id, quantity%, buyer_email@, total$; +cancel"],
    "docusign": ["envelope: email_subject, signer_email@, document_name, status=created|sent|completed; +send, +void"],
    "zillow": ["property(GLS): address, city, price$, bedrooms%, sqft%", "saved_search: name, city, max_price$"],
    "supabase": ["row: table, values_json, created_at#", "bucket(CGLD): name, public?"],
    "firebase": ["document: collection, doc_id, data_json", "user(CGLD): email@, display_name, disabled?"],
    "mongodb_atlas": ["cluster: name, provider=aws|gcp|azure, tier, state=idle|creating; +pause, +resume", "database_user(CGLD): username, role=read|readWrite|admin"],
    "npm_registry": ["package(GS): !name, version, description, weekly_downloads%", "dist_tag(GLU): package, tag, version"],
    "pypi": ["project(GS): !name, version, summary, requires_python", "release(GL): project, version, upload_time#"],
    "wikipedia": ["article(GS): !title, summary, url, page_id%", "revision(GL): title, revid%, user, timestamp#"],
    "arxiv": ["paper(GS): !arxiv_id, title, authors[], abstract, published#", "listing(L): category, title"],
    "news_api": ["article(LS): title, source, author, published_at#, url", "source(GL): name, category, country"],
    "translation": ["translation(C): text, target_language=en|de|fr|es|ja, source_language, translated_text", "glossary(CGLD): name, source_language, target_language"],
}

TYPES = {"@": {"type": "string", "format": "email"}, "#": {"type": "string", "format": "date"}, "$": {"type": "number"},
         "%": {"type": "integer"}, "?": {"type": "boolean"}}


def _plural(w: str) -> str:
    if w.endswith("y") and not w.endswith(("ay", "ey", "oy")):
        return w[:-1] + "ies"
    if w.endswith(("s", "x", "ch", "sh")):
        return w + "es"
    return w + "s"


def _field(tok: str) -> tuple[str, dict, bool]:
    tok = tok.strip()
    key = tok.startswith("!")
    tok = tok.lstrip("!")
    if "=" in tok:
        name, vals = tok.split("=", 1)
        return name, {"type": "string", "enum": vals.split("|")}, key
    if tok.endswith("[]"):
        return tok[:-2], {"type": "array", "items": {"type": "string"}}, key
    if tok[-1] in TYPES:
        return tok[:-1], dict(TYPES[tok[-1]]), key
    return tok, {"type": "string"}, key


def _obj(props: dict, required: list[str], title: str) -> dict:
    return {"type": "object", "title": title, "properties": props, "required": required}


def entity_tools(service: str, spec: str) -> list[dict]:
    """Returns MCP tool specs for one entity template (see module docstring)."""
    head, body = spec.split(":", 1)
    ops = "CGLSUD"
    if "(" in head:
        head, ops = head[:-1].split("(")
    ent = head.strip()
    parts = [p.strip() for p in body.split(";")]
    fields = [_field(t) for t in parts[0].split(",") if t.strip()]
    actions = [a.strip()[1:] for a in (parts[1].split(",") if len(parts) > 1 else []) if a.strip()]
    keys = [n for n, _, k in fields if k]
    props = {n: s for n, s, _ in fields}
    id_name = f"{ent}_id"
    label = ent.replace("_", " ")
    svc = service.replace("_", " ")
    record = _obj({id_name: {"type": "string"}, **props}, [id_name] + [n for n, _, _ in fields], ent.title().replace("_", ""))
    id_in = {id_name: {"type": "string", "description": f"id of the {label}"}}
    tools = []

    def add(name, desc, inp, req, out):
        tools.append({"name": name, "description": desc, "inputSchema": _obj(inp, req, f"{name}Arguments"),
                      "outputSchema": out})

    listing = _obj({_plural(ent): {"type": "array", "items": record}, "count": {"type": "integer"}},
                   [_plural(ent), "count"], f"{ent}List")
    if keys:  # natural-key entities (weather, quotes, places): lookups, no ids
        kp = {k: props[k] for k in keys}
        if "G" in ops:
            add(f"get_{ent}", f"Get the {label} for {', '.join(keys)} from {svc}.", kp, keys, record)
        rest = {n: s for n, s, k in fields if not k and s.get("type") in ("string", "integer")}
        if "L" in ops:
            add(f"list_{_plural(ent)}", f"List {_plural(label)} in {svc}.", {**kp, "limit": {"type": "integer", "default": 10}}, [], listing)
        if "S" in ops:
            add(f"search_{_plural(ent)}", f"Search {_plural(label)} in {svc} by text.",
                {"query": {"type": "string"}, "limit": {"type": "integer", "default": 10}}, ["query"], listing)
        _ = rest
        return tools
    req = [n for n, _, _ in fields[:2]]
    if "C" in ops:
        add(f"create_{ent}", f"Create a {label} in {svc}; returns it with its {id_name}.", props, req, record)
    if "G" in ops:
        add(f"get_{ent}", f"Get a {label} from {svc} by {id_name}.", id_in, [id_name], record)
    if "L" in ops:
        filt = {n: s for n, s, _ in fields if "enum" in s or s.get("format") == "email"}
        add(f"list_{_plural(ent)}", f"List {_plural(label)} in {svc}, optionally filtered.",
            {**filt, "limit": {"type": "integer", "default": 20, "minimum": 0}}, [], listing)
    if "S" in ops:
        add(f"search_{_plural(ent)}", f"Search {_plural(label)} in {svc} by text.",
            {"query": {"type": "string"}, "limit": {"type": "integer", "default": 20, "minimum": 0}}, ["query"], listing)
    if "U" in ops:
        add(f"update_{ent}", f"Update fields of a {label} in {svc}.", {**id_in, **props}, [id_name], record)
    if "D" in ops:
        add(f"delete_{ent}", f"Delete a {label} from {svc}.", id_in, [id_name],
            _obj({id_name: {"type": "string"}, "deleted": {"type": "boolean"}}, [id_name, "deleted"], "Deleted"))
    for a in actions:
        add(f"{a}_{ent}", f"{a.replace('_', ' ').capitalize()} a {label} in {svc}.", dict(id_in), [id_name], record)
    return tools


def service_manifest(service: str) -> dict:
    tools = [t for spec in SERVICES[service] for t in entity_tools(service, spec)]
    names = [t["name"] for t in tools]
    assert len(names) == len(set(names)), f"{service}: duplicate tool names {names}"
    return {"server": service, "source": "generated: toolverse_jax.envs.gen_manifests", "tools": tools}


def main() -> None:
    out_dir = os.path.join(MANIFEST_DIR, "synth")
    os.makedirs(out_dir, exist_ok=True)
    n_tools = 0
    for s in SERVICES:
        m = service_manifest(s)
        n_tools += len(m["tools"])
        with open(os.path.join(out_dir, f"{s}.json"), "w") as f:
            json.dump(m, f, indent=1, sort_keys=True)
            f.write("\n")
    for p in sorted(glob.glob(os.path.join(MANIFEST_DIR, "third_party", "*.json"))):
        with open(p) as f:
            m = json.load(f)
        name = os.path.splitext(os.path.basename(p))[0] + "_sim"
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump({"server": name, "source": f"simulated twin of harvested {os.path.basename(p)}",
                       "tools": m["tools"]}, f, indent=1, sort_keys=True)
            f.write("\n")
        n_tools += len(m["tools"])
    print(f"wrote {len(SERVICES)} generated + twins, {n_tools} tools to {out_dir}")


if __name__ == "__main__":
    main()
