"""algorithms/kofl"""
