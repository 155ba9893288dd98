"""rapid"""
